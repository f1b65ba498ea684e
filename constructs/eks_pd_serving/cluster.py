"""The EKS control plane (native AWS::EKS::Cluster), its add-ons and the system node group."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import cast

from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from . import versions
from ._private import launch_template, nag
from ._private.kms import rotating_key
from .layout import SYSTEM_NODE_LABELS
from .lifecycle.needs import control_plane_log_group_name
from .log_groups import LogGroups

_CLUSTER_ADMIN_POLICY = "AmazonEKSClusterAdminPolicy"
_API_PORT = 443
# Installed before any node group: nodes need the CNI and kube-proxy to become Ready.
_NODE_ADDONS = {"VpcCni": "vpc-cni", "KubeProxy": "kube-proxy", "PodIdentityAgent": "eks-pod-identity-agent"}
# The VPC CNI's network policy agent enforces NetworkPolicies (off unless asked for).
_ADDON_CONFIGURATION = {"vpc-cni": {"enableNetworkPolicy": "true"}}


@dataclass(frozen=True)
class EksClusterProps:
    """What the cluster construct needs, each with its default."""

    #: EKS cluster name (physical). Default: "ray-llm-multinode".
    cluster_name: str = "ray-llm-multinode"
    #: Kubernetes version; the kubectl layer follows it. Default: versions.DEFAULT_KUBERNETES_VERSION.
    kubernetes_version: str = versions.DEFAULT_KUBERNETES_VERSION
    #: IPv4 CIDRs allowed to the public API endpoint. Default: ('0.0.0.0/0',).
    endpoint_allowed_cidrs: tuple[str, ...] = ("0.0.0.0/0",)
    #: Role granted cluster admin. Default: None (a role the account may assume is created).
    admin_role_arn: str | None = None
    #: Instance type of the system node group (KubeRay operator, Ray head). Default: "m7i.xlarge".
    system_instance_type: str = "m7i.xlarge"
    #: Nodes in the system node group. Default: 1.
    system_node_count: int = 1
    #: gp3 root volume of each system node, GiB. Default: 100.
    system_root_volume_gib: int = 100


class EksCluster(Construct):
    """Cluster, managed add-ons, secrets encryption key, admin access and system nodes.

    :param props: names, version, access and system nodes (``EksClusterProps``). Default: EksClusterProps().
    :param vpc: the VPC; the cluster and the kubectl provider use its private subnets.
    :param log_groups: where control-plane and Lambda logs go (created before the cluster).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        props: EksClusterProps = EksClusterProps(),
        vpc: ec2.IVpc,
        log_groups: LogGroups,
    ) -> None:
        super().__init__(scope, id)
        release = versions.KUBERNETES_RELEASES[props.kubernetes_version]
        layer_class = getattr(importlib.import_module(release.kubectl_layer_module), release.kubectl_layer_class)
        kubectl_layer: lambda_.ILayerVersion = layer_class(self, "KubectlLayer")

        self.secrets_key = rotating_key(
            self, "SecretsKey", f"Envelope encryption of Kubernetes secrets in {props.cluster_name}"
        )
        # EKS writes control-plane logs here; created first, so the group is ours and goes with
        # the stack instead of appearing on first write and outliving it.
        self.control_plane_logs = log_groups.group(
            self, "ControlPlaneLogGroup", log_group_name=control_plane_log_group_name(props.cluster_name)
        )
        # The kubectl provider's Lambdas get a security group of the stack's own: on the
        # EKS-owned cluster security group their late-released ENIs keep EKS from deleting it,
        # which then blocks deleting the VPC.
        self.kubectl_security_group = ec2.SecurityGroup(
            self,
            "KubectlProviderSecurityGroup",
            vpc=vpc,
            description="kubectl/Helm provider Lambdas: out to the EKS API and chart repositories",
            allow_all_outbound=True,
        )
        private = ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)
        self.cluster = eks.Cluster(
            self,
            "Resource",
            cluster_name=props.cluster_name,
            version=eks.KubernetesVersion.of(props.kubernetes_version),
            vpc=vpc,
            vpc_subnets=[private],
            endpoint_access=eks.EndpointAccess.PUBLIC_AND_PRIVATE.only_from(*props.endpoint_allowed_cidrs),
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
                kubectl_layer=kubectl_layer,
                private_subnets=vpc.private_subnets,
                security_groups=[self.kubectl_security_group],
            ),
        )
        self.cluster.node.add_dependency(self.control_plane_logs)
        api_from_kubectl = ec2.CfnSecurityGroupIngress(
            self,
            "ApiFromKubectlProvider",
            group_id=self.cluster.cluster_security_group_id,
            source_security_group_id=self.kubectl_security_group.security_group_id,
            ip_protocol="tcp",
            from_port=_API_PORT,
            to_port=_API_PORT,
            description="kubectl/Helm provider Lambdas to the private API endpoint",
        )
        # The same cluster, typed as the interface other constructs take: jsii's generated
        # ICluster protocol lists a member Cluster only provides at runtime, which mypy rejects.
        self.handle = cast(eks.ICluster, self.cluster)
        nag.acknowledge(self.cluster.role, nag.CLUSTER_ROLE)
        if self.cluster.kubectl_provider is not None:
            nag.acknowledge(self.cluster.kubectl_provider, nag.kubectl_provider(self.cluster.kubectl_provider))
            # Every kubectl/Helm resource is served by the provider's Lambdas, so it is deleted before
            # them and, through them, before this rule: `kubectl delete` and `helm uninstall` still
            # reach the API while the stack is destroyed (nothing else depends on the rule).
            self.cluster.kubectl_provider.node.add_dependency(api_from_kubectl)

        self._system_nodes(props)
        self._admin_access(props)

    def _system_nodes(self, props: EksClusterProps) -> None:
        """The add-ons nodes need, the system node group (its launch template) and CoreDNS on it."""
        node_addons = [
            eks.Addon(
                self,
                addon_id,
                cluster=self.handle,
                addon_name=name,
                configuration_values=_ADDON_CONFIGURATION.get(name),
            )
            for addon_id, name in _NODE_ADDONS.items()
        ]
        # A launch template for the root volume (EKS gives 20 GiB otherwise: too small for the Ray
        # image) and IMDSv2; with no network interfaces in it, EKS still adds the cluster SG.
        L = ec2.CfnLaunchTemplate
        self.system_launch_template = L(
            self,
            "SystemLaunchTemplate",
            launch_template_data=L.LaunchTemplateDataProperty(
                block_device_mappings=[launch_template.root_volume(props.system_root_volume_gib)],
                metadata_options=launch_template.imds_v2(launch_template.SYSTEM_IMDS_HOP_LIMIT),
            ),
        )
        self.system_nodes = self.cluster.add_nodegroup_capacity(
            "SystemNodeGroup",
            instance_types=[ec2.InstanceType(props.system_instance_type)],
            ami_type=eks.NodegroupAmiType.AL2023_X86_64_STANDARD,
            launch_template_spec=launch_template.latest(self.system_launch_template),
            min_size=props.system_node_count,
            desired_size=props.system_node_count,
            max_size=props.system_node_count,
            labels=SYSTEM_NODE_LABELS,
            subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
        )
        nag.acknowledge(self.system_nodes.role, nag.NODE_ROLE)
        for addon in node_addons:
            self.system_nodes.node.add_dependency(addon)
        self.node_addons = node_addons
        # CoreDNS needs a node to run on, or the add-on never becomes active.
        self.core_dns = eks.Addon(self, "CoreDns", cluster=self.handle, addon_name="coredns")
        self.core_dns.node.add_dependency(self.system_nodes)

    def _admin_access(self, props: EksClusterProps) -> None:
        """Cluster admin for the named role, or for a role of the stack's the account may assume."""
        # A person must reach the cluster after the first deploy: the named role, or a role of
        # the stack's that this account's principals may assume (their IAM permissions decide).
        self.admin_role: iam.Role | None = None
        admin_role_arn = props.admin_role_arn
        if admin_role_arn is None:
            self.admin_role = iam.Role(
                self,
                "AdminRole",
                assumed_by=iam.AccountRootPrincipal(),
                description=f"Cluster admin of EKS cluster {props.cluster_name} (access entry)",
            )
            self.admin_role.add_to_policy(
                iam.PolicyStatement(actions=["eks:DescribeCluster"], resources=[self.cluster.cluster_arn])
            )
            admin_role_arn = self.admin_role.role_arn
        self.admin_role_arn = admin_role_arn
        self.cluster.grant_access(
            "AdminAccess",
            admin_role_arn,
            [
                eks.AccessPolicy.from_access_policy_name(
                    _CLUSTER_ADMIN_POLICY, access_scope_type=eks.AccessScopeType.CLUSTER
                )
            ],
        )
