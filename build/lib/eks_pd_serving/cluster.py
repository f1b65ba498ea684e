"""The EKS control plane (native AWS::EKS::Cluster), its add-ons and the system node group."""

from __future__ import annotations

import importlib
from typing import cast

from aws_cdk import Annotations, Duration, RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from ._private import nag
from .config import DeploymentConfig
from .network import Network

SYSTEM_NODE_LABELS = {"role": "system"}
# Installed before any node group: nodes need the CNI and kube-proxy to become Ready.
_NODE_ADDONS = {"VpcCni": "vpc-cni", "KubeProxy": "kube-proxy", "PodIdentityAgent": "eks-pod-identity-agent"}


class EksCluster(Construct):
    """Cluster, managed add-ons, secrets encryption key, admin access and system nodes."""

    def __init__(self, scope: Construct, id: str, *, config: DeploymentConfig, network: Network) -> None:
        super().__init__(scope, id)
        release = config.kubernetes_release
        layer_class = getattr(importlib.import_module(release.kubectl_layer_module), release.kubectl_layer_class)
        kubectl_layer: lambda_.ILayerVersion = layer_class(self, "KubectlLayer")

        self.secrets_key = kms.Key(
            self,
            "SecretsKey",
            description=f"Envelope encryption of Kubernetes secrets in {config.cluster_name}",
            enable_key_rotation=True,
            removal_policy=RemovalPolicy.DESTROY,
            pending_window=Duration.days(30),
        )
        private = ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)
        self.cluster = eks.Cluster(
            self,
            "Resource",
            cluster_name=config.cluster_name,
            version=eks.KubernetesVersion.of(config.kubernetes_version),
            vpc=network.vpc,
            vpc_subnets=[private],
            endpoint_access=eks.EndpointAccess.PUBLIC_AND_PRIVATE.only_from(*config.endpoint_allowed_cidrs),
            cluster_logging=list(eks.ClusterLoggingTypes),
            secrets_encryption_key=self.secrets_key,
            # Managed node groups, not Auto Mode; the add-ons below are installed as managed ones.
            default_capacity_type=eks.DefaultCapacityType.NODEGROUP,
            default_capacity=0,
            bootstrap_self_managed_addons=False,
            output_config_command=False,
            # In the VPC, the kubectl handler reaches the private endpoint, so a narrow public
            # allow-list never locks CloudFormation out of its own cluster.
            kubectl_provider_options=eks.KubectlProviderOptions(
                kubectl_layer=kubectl_layer, private_subnets=network.vpc.private_subnets
            ),
        )
        # The same cluster, typed as the interface other constructs take: jsii's generated
        # ICluster protocol lists a member Cluster only provides at runtime, which mypy rejects.
        self.handle = cast(eks.ICluster, self.cluster)
        nag.acknowledge(self.cluster.role, nag.CLUSTER_ROLE)
        if self.cluster.kubectl_provider is not None:
            nag.acknowledge(self.cluster.kubectl_provider, nag.kubectl_provider(self.cluster.kubectl_provider))
        for warning in config.warnings():
            Annotations.of(self).add_warning_v2("eks-pd-serving:config", warning)

        node_addons = [
            eks.Addon(self, addon_id, cluster=self.handle, addon_name=name) for addon_id, name in _NODE_ADDONS.items()
        ]
        self.system_nodes = self.cluster.add_nodegroup_capacity(
            "SystemNodeGroup",
            instance_types=[ec2.InstanceType(config.system_instance_type)],
            ami_type=eks.NodegroupAmiType.AL2023_X86_64_STANDARD,
            min_size=config.system_node_count,
            desired_size=config.system_node_count,
            max_size=config.system_node_count,
            labels=SYSTEM_NODE_LABELS,
            subnets=private,
        )
        nag.acknowledge(self.system_nodes.role, nag.NODE_ROLE)
        for addon in node_addons:
            self.system_nodes.node.add_dependency(addon)
        self.node_addons = node_addons
        # CoreDNS needs a node to run on, or the add-on never becomes active.
        core_dns = eks.Addon(self, "CoreDns", cluster=self.handle, addon_name="coredns")
        core_dns.node.add_dependency(self.system_nodes)

        if config.admin_role_arn:
            self.cluster.grant_access(
                "AdminAccess",
                config.admin_role_arn,
                [
                    eks.AccessPolicy.from_access_policy_name(
                        "AmazonEKSClusterAdminPolicy", access_scope_type=eks.AccessScopeType.CLUSTER
                    )
                ],
            )
