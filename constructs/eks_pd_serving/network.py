"""The VPC: public and private subnets in two or more AZs, NAT, flow logs."""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Aws, RemovalPolicy, Token
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct

from ._private import checkov
from ._private.kms import rotating_key
from .config import ConstructError

_DEFAULT_MAX_AZS = 2
# The VPC this package creates when none is brought.
VPC_CIDR = "10.0.0.0/16"


class Network(Construct):
    """VPC for the cluster, new or brought; ``gpu_subnet`` is the one private subnet of the GPU
    node groups.

    :param vpc: an existing VPC with private subnets (with egress) in two or more AZs; its NAT,
        flow logs and S3 gateway endpoint stay its owner's (without one, S3 reads cross its
        NAT). Default: a new VPC (10.0.0.0/16, public and private subnets,
        NAT, an S3 gateway endpoint on the private route tables, flow logs into a KMS-encrypted group
        kept one year).
    :param availability_zones: AZs of a new VPC. Default: the region's first two.
    :param nat_gateways: NAT gateways of a new VPC. Default: 1.
    :param gpu_availability_zone: AZ of the GPU subnet (EFA does not cross AZs). Default: the AZ
        of the first private subnet.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        vpc: ec2.IVpc | None = None,
        availability_zones: Sequence[str] | None = None,
        nat_gateways: int = 1,
        gpu_availability_zone: str | None = None,
    ) -> None:
        super().__init__(scope, id)
        if vpc is not None:
            self.vpc = vpc
            self._check_brought_vpc(self, vpc)
        else:
            self.vpc = self._new_vpc(availability_zones, nat_gateways)
        # Without a named AZ the first private subnet is chosen, which is stable across synths.
        self.gpu_subnet = self._gpu_subnet(gpu_availability_zone)

    @property
    def cidr(self) -> str | None:
        """The VPC's IPv4 CIDR as a literal (a NetworkPolicy needs one), or None when a brought
        VPC's CIDR is only known at deploy time."""
        if isinstance(self.vpc, ec2.Vpc) and self.vpc.node.scope is self:
            return VPC_CIDR
        try:
            cidr = self.vpc.vpc_cidr_block
        except RuntimeError:  # imported by attributes without its CIDR
            return None
        return None if Token.is_unresolved(cidr) else cidr

    def _new_vpc(self, availability_zones: Sequence[str] | None, nat_gateways: int) -> ec2.IVpc:
        azs = list(availability_zones) if availability_zones else None
        vpc = ec2.Vpc(
            self,
            "Resource",
            ip_addresses=ec2.IpAddresses.cidr(VPC_CIDR),
            availability_zones=azs,
            max_azs=None if azs else _DEFAULT_MAX_AZS,
            nat_gateways=nat_gateways,
            subnet_configuration=[
                ec2.SubnetConfiguration(name="Public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24),
                # /19: room for the VPC CNI's one IP per pod on every node.
                ec2.SubnetConfiguration(name="Private", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, cidr_mask=19),
            ],
        )
        self.flow_log_key = rotating_key(self, "FlowLogKey", "Encryption of the VPC flow log group")
        self.flow_log_key.grant_encrypt_decrypt(iam.ServicePrincipal(f"logs.{Aws.REGION}.amazonaws.com"))
        self.flow_log_group = logs.LogGroup(
            self,
            "FlowLogGroup",
            encryption_key=self.flow_log_key,
            retention=logs.RetentionDays.ONE_YEAR,
            removal_policy=RemovalPolicy.DESTROY,
        )
        _skip_checkov_outside_vpc(self)
        # S3 from the private subnets (the engines' weights, image layers ECR keeps in S3) stays
        # off the NAT: no per-GB processing charge, no NAT bandwidth limit.
        vpc.add_gateway_endpoint(
            "S3Endpoint",
            service=ec2.GatewayVpcEndpointAwsService.S3,
            subnets=[ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)],
        )
        vpc.add_flow_log(
            "FlowLog",
            traffic_type=ec2.FlowLogTrafficType.ALL,
            destination=ec2.FlowLogDestination.to_cloud_watch_logs(self.flow_log_group),
        )
        return vpc

    @staticmethod
    def _check_brought_vpc(scope: Construct, vpc: ec2.IVpc) -> None:
        azs = {subnet.availability_zone for subnet in vpc.private_subnets}
        if len(vpc.private_subnets) < 2 or len(azs) < 2:
            raise ConstructError(
                scope,
                "NetworkVpcTooFewAzs",
                f"vpc={vpc.node.path} has {len(vpc.private_subnets)} private subnet(s) in {len(azs)} AZ(s); "
                "EKS needs private subnets in at least two AZs. Fix: bring a VPC with private subnets in two AZs",
            )

    def _gpu_subnet(self, availability_zone: str | None) -> ec2.ISubnet:
        if availability_zone is None:
            return self.vpc.private_subnets[0]
        selected = [s for s in self.vpc.private_subnets if s.availability_zone == availability_zone]
        if not selected:
            raise ConstructError(
                self,
                "NetworkGpuAzWithoutSubnet",
                f"gpu_availability_zone={availability_zone!r} has no private subnet in the VPC. "
                "Fix: choose an AZ the VPC has a private subnet in",
                setting="gpu_availability_zone",
            )
        return selected[0]


def _skip_checkov_outside_vpc(scope: Construct) -> None:
    """aws-cdk-lib's provider for ``@aws-cdk/aws-ec2:restrictDefaultSecurityGroup`` (a
    stack-level singleton the VPC creates) runs outside the VPC it strips: nothing to reach in it."""
    checkov.skip_stack_provider(
        scope,
        "Custom::VpcRestrictDefaultSG",
        checkov.LAMBDA_OUTSIDE_VPC,
        "Calls only the EC2 API; nothing in the VPC to reach",
    )
