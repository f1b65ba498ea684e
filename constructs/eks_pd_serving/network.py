"""The VPC: public and private subnets in two or more AZs, NAT, flow logs."""

from __future__ import annotations

from aws_cdk import aws_ec2 as ec2

from constructs import Construct

from .config import DeploymentConfig

_DEFAULT_MAX_AZS = 2


class Network(Construct):
    """VPC for the cluster; ``gpu_subnet`` is the one private subnet of the GPU node group."""

    def __init__(self, scope: Construct, id: str, *, config: DeploymentConfig) -> None:
        super().__init__(scope, id)
        azs = list(config.availability_zones) if config.availability_zones else None
        self.vpc = ec2.Vpc(
            self,
            "Resource",
            ip_addresses=ec2.IpAddresses.cidr("10.0.0.0/16"),
            availability_zones=azs,
            max_azs=None if azs else _DEFAULT_MAX_AZS,
            nat_gateways=config.nat_gateways,
            subnet_configuration=[
                ec2.SubnetConfiguration(name="Public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24),
                # /19: room for the VPC CNI's one IP per pod on every node.
                ec2.SubnetConfiguration(
                    name="Private", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, cidr_mask=19
                ),
            ],
        )
        self.vpc.add_flow_log("FlowLog", traffic_type=ec2.FlowLogTrafficType.ALL)
        # EFA does not cross AZs: the whole GPU group lives in one subnet. Without a named AZ
        # the first private subnet is chosen, which is stable across synths.
        self.gpu_subnet = self._gpu_subnet(config.gpu_availability_zone)

    def _gpu_subnet(self, availability_zone: str | None) -> ec2.ISubnet:
        if availability_zone is None:
            return self.vpc.private_subnets[0]
        selected = self.vpc.select_subnets(
            subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, availability_zones=[availability_zone]
        )
        return selected.subnets[0]
