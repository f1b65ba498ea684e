"""The whole deployment as one construct: VPC to RayService. This is what an account-vending
pipeline imports; `app.py` is one user of it. It composes the constructs and orders them; what
each takes from the settings (``DeploymentConfig``) is decided in ``mapping``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from aws_cdk import Annotations, Stack, Token
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

from . import k8s, mapping, observability
from ._private import nag
from ._private.pod_identity import pod_identity_role
from .capacity_block_end import CapacityBlockEnd, CapacityBlockGroup
from .capacity_check import GpuCapacityCheck
from .cluster import EksCluster
from .cluster_autoscaler import ClusterAutoscaler
from .config import ConstructError, DeploymentConfig
from .device_plugins import GpuDevicePlugins
from .endpoint.api_keys import ApiKeys
from .endpoint.internal_endpoint import InternalEndpoint
from .endpoint.load_balancer_controller import AwsLoadBalancerController
from .endpoint.serving_network import ServingNetwork
from .fault_tolerance.gcs_store import GcsStore
from .gpu_node_group import EfaGpuNodeGroup
from .k8s import GcsFaultToleranceSpec, ServingNetworkProps
from .k8s.names import endpoint_service_name
from .kuberay_operator import NAMESPACE as OPERATOR_NAMESPACE
from .kuberay_operator import KubeRayOperator
from .log_groups import LogGroups
from .network import Network
from .observability.addon import CloudWatchObservability
from .observability.dashboard import ServingDashboard
from .ray_service import RayServiceManifest, refuse_gpu_shortfall
from .rollout_plan import rollout_plan, with_rollout_program
from .weights import ModelWeights


class PdServing(Construct):
    """Prefill/decode LLM serving on EKS.

    :param config: every setting, validated (``DeploymentConfig.create(...)`` or
        ``DeploymentConfig.from_context(...)``); its fields document their defaults.
    :param vpc: an existing VPC with private subnets (with egress) in two or more AZs.
        Default: a new VPC (10.0.0.0/16, public and private subnets in two AZs, NAT, flow logs).
    :param models: the served models, each a ``k8s.ServedModel`` (``mapping.served_model(config)`` is
        the settings' first), behind one ingress that routes by ``model_id``, each with its own phase
        applications and failover; they replace the settings' models in the serve config. A model
        whose ``k8s.Weights`` are the repository and revision of one the settings stage
        (``model_source``, ``served_models``; weights_source=s3) loads that staged copy; any other
        loads what its ``Weights`` say (the Hub at its revision, or a ``staged_uri`` the Ray workers
        can read). Every model's GPUs are counted against the worker groups: a deployment that needs
        more is refused at synth with the numbers. Default: None (the settings' models).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        config: DeploymentConfig,
        vpc: ec2.IVpc | None = None,
        models: Sequence[k8s.ServedModel] | None = None,
    ) -> None:
        super().__init__(scope, id)
        self.config = config
        self.models = None if models is None else tuple(models)
        self.plan = plan = mapping.plan(config, brought_vpc=vpc is not None)
        self.region = plan.region
        self._refuse_duplicate_cluster_name()
        self._refuse_other_region()
        self._cluster_and_nodes(plan, vpc)
        self._operators(plan)
        self._serving(plan, config)
        self._observe(plan)
        self._end_capacity_blocks(plan)
        self._expose(config)
        # Last: aws-cdk-lib's own provider Lambdas exist only once their users do.
        self.log_groups.adopt_lambda_logs(self)

    def _cluster_and_nodes(self, plan: mapping.DeploymentPlan, vpc: ec2.IVpc | None) -> None:
        """The network, the log groups, the capacity check, the cluster and the GPU node groups."""
        self.network = Network(
            self,
            "Network",
            vpc=vpc,
            availability_zones=plan.network.availability_zones,
            nat_gateways=plan.network.nat_gateways,
            gpu_availability_zone=plan.network.gpu_availability_zone,
        )
        self.log_groups = LogGroups(self, "Logs", retention_days=plan.log_retention_days)
        # Before the cluster: a GPU AZ or quota that cannot work fails the deploy in minutes.
        self.capacity_check = GpuCapacityCheck(
            self,
            "GpuCapacityCheck",
            cluster_name=plan.cluster_name,
            gpu_availability_zone=self.network.gpu_subnet.availability_zone,
            groups=plan.capacity_needs,
            log_groups=self.log_groups,
            reservations=plan.reservations,
        )
        self.eks = EksCluster(self, "Cluster", props=plan.cluster, vpc=self.network.vpc, log_groups=self.log_groups)
        for warning in plan.warnings:
            Annotations.of(self.eks).add_warning_v2("eks-pd-serving:config", warning)
        self.eks.cluster.node.add_dependency(self.capacity_check)
        self.gpu_node_groups = [
            EfaGpuNodeGroup(
                self,
                group.group.construct_id,
                group=group.group,
                cluster=self.eks.cluster,  # its documented exception: the concrete Cluster
                vpc=self.network.vpc,
                subnet=self.network.gpu_subnet,
                root_volume_gib=group.root_volume_gib,
                capacity=group.capacity,
                fast_image_pull=group.fast_image_pull,
                local_storage=group.local_storage,
            )
            for group in plan.gpu_node_groups
        ]
        self.gpu_nodes = self.gpu_node_groups[0]
        self.gpu_nodegroups = [group.nodegroup for group in self.gpu_node_groups]
        for nodegroup in self.gpu_nodegroups:
            for addon in self.eks.node_addons:
                nodegroup.node.add_dependency(addon)

    def _operators(self, plan: mapping.DeploymentPlan) -> None:
        """What runs before the Ray cluster: KubeRay, the device plugins, the Cluster Autoscaler."""
        self.kuberay = KubeRayOperator(self, "KubeRay", cluster=self.eks.handle)
        self.kuberay.node.add_dependency(self.eks.system_nodes)
        self.device_plugins = GpuDevicePlugins(self, "DevicePlugins", cluster=self.eks.handle)
        for nodegroup in self.gpu_nodegroups:
            self.device_plugins.node.add_dependency(nodegroup)

        # Autoscaling: the Cluster Autoscaler runs before the Ray cluster asks for nodes, and is
        # removed only after it (a group at zero nodes needs it for the first worker pod).
        self.cluster_autoscaler: ClusterAutoscaler | None = None
        if plan.autoscaler_kubernetes_version:
            self.cluster_autoscaler = ClusterAutoscaler(
                self,
                "ClusterAutoscaler",
                cluster=self.eks.handle,
                kubernetes_version=plan.autoscaler_kubernetes_version,
                region=self.region,
            )
            self.cluster_autoscaler.chart.node.add_dependency(self.eks.system_nodes)

    def _serving(self, plan: mapping.DeploymentPlan, config: DeploymentConfig) -> None:
        """The weights, the API keys, the GCS store, the Ray pods' identities and the RayService."""
        weights = self._stage_weights(plan.weights)
        self.api_keys = ApiKeys(self, "ApiKeys", secret_arn=plan.api_keys_secret_arn) if plan.api_keys else None
        self.gcs_store = self._gcs_store(plan.gcs_store)
        access = self._grant_ray_pods(plan.identities)
        props = mapping.ray_service_props(
            config,
            plan.image,
            weights.uri if weights else None,
            self.api_keys.secret_arn if self.api_keys else None,
            GcsFaultToleranceSpec(self.gcs_store.address, self.gcs_store.auth_token.secret_arn)
            if self.gcs_store
            else None,
            staged_uris={model_id: uri for model_id, (uri, _) in weights.more.items()} if weights else None,
        )
        if self.models is not None:
            staged = [served.model.weights for served in props.models]
            props = replace(props, models=mapping.with_staged_weights(self.models, staged))
        props = with_rollout_program(props)
        refuse_gpu_shortfall(self, props)  # before the rollouts are planned from the models
        # The rollouts decided once, from the props the manifest applies.
        rollouts = rollout_plan(
            props,
            Stack.of(self).resolve,
            converge=plan.converge,
            rollout_deadline_s=plan.rollout_deadline_s,
            serve_step_s=plan.serve_step_s,
        )
        self.ray_service = RayServiceManifest(
            self,
            "RayService",
            props=props,
            cluster=self.eks.handle,
            depends_on=[
                self.kuberay,
                self.device_plugins,
                self.eks.system_nodes,
                *self.gpu_nodegroups,
                *([self.cluster_autoscaler] if self.cluster_autoscaler else []),
                # The engines start once the weights are staged, with their identities in place.
                *([weights.resource, *(resource for _, resource in weights.more.values())] if weights else []),
                *access,
            ],
            rollouts=rollouts,
        )

    def _stage_weights(self, plan: mapping.WeightsPlan | None) -> ModelWeights | None:
        """With ``weights_source=s3``: the bucket and the staging job the deploy waits for."""
        self.weights: ModelWeights | None = None
        if plan is None:
            return None
        self.weights = ModelWeights(
            self,
            "ModelWeights",
            model_source=plan.model_source,
            revision=plan.revision,
            log_groups=self.log_groups,
            hf_token_secret=plan.hf_token_secret,
            removal=plan.removal,
            more=plan.more,
            access_logs=(
                (s3.Bucket.from_bucket_name(self, "AccessLogsBucket", plan.access_logs[0]), plan.access_logs[1])
                if plan.access_logs
                else None
            ),
        )
        return self.weights

    def _gcs_store(self, plan: mapping.GcsStorePlan | None) -> GcsStore | None:
        """With ``gcs_fault_tolerance``: the head's GCS store in the private subnets, admitting the
        cluster security group (the nodes', the head's among them)."""
        if plan is None:
            return None
        private = self.network.vpc.select_subnets(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)
        return GcsStore(
            self,
            "GcsStore",
            vpc=self.network.vpc,
            subnets=private.subnets,
            client_security_group_id=self.eks.cluster.cluster_security_group_id,
            node_type=plan.node_type,
            replicas=plan.replicas,
        )

    def _grant_ray_pods(self, plan: mapping.PodIdentityPlan) -> list[Construct]:
        """EKS Pod Identity for the Ray pods' service accounts: the workers read the staged prefix
        and the key secret; the head the key secret and the GCS store's token. Each identity's scope
        (role, policy, association) for the RayService to wait on: its pods get credentials only if
        the association exists when they start, and their calls are allowed only once the policy is
        attached; on destroy KubeRay's GCS cleanup Job still reads the token as the head."""
        self.worker_access: eks.CfnPodIdentityAssociation | None = None
        self.head_access: eks.CfnPodIdentityAssociation | None = None
        scopes: list[Construct] = []

        def identity(
            scope_id: str, service_account: str, description: str
        ) -> tuple[iam.Role, eks.CfnPodIdentityAssociation]:
            scopes.append(scope := Construct(self, scope_id))
            return pod_identity_role(
                scope,
                cluster=self.eks.handle,
                namespace=plan.namespace,
                service_account=service_account,
                description=description,
            )

        if self.weights or self.api_keys:
            role, self.worker_access = identity(
                "WorkerIdentity",
                plan.worker_service_account,
                _identity_description("Ray workers", bool(self.weights), bool(self.api_keys)),
            )
            if self.weights:
                self.weights.grant_read(role)
                nag.acknowledge(role, nag.model_readers(self.weights.bucket))
                if self.plan.weights and self.plan.weights.share_compile_caches:
                    self.weights.share_compile_caches(role)
                    nag.acknowledge(role, nag.compile_sharers(self.weights.bucket))
            if self.api_keys:
                self.api_keys.grant_read(role)
        if self.api_keys or self.gcs_store:
            role, self.head_access = identity(
                "HeadIdentity",
                plan.head_service_account,
                _identity_description("Ray head", False, bool(self.api_keys), bool(self.gcs_store)),
            )
            if self.api_keys:
                self.api_keys.grant_read(role)
            if self.gcs_store:
                self.gcs_store.grant_token_read(role)
        return scopes

    def _observe(self, plan: mapping.DeploymentPlan) -> None:
        """With ``observability``: the CloudWatch add-on, after the nodes it runs on (and before
        the Ray cluster, so the first engines' logs and metrics are collected), and the dashboard."""
        self.observability: CloudWatchObservability | None = None
        self.dashboard: ServingDashboard | None = None
        settings = plan.observability
        if settings is None:
            return
        self.observability = CloudWatchObservability(
            self,
            "Observability",
            cluster=self.eks.handle,
            cluster_name=plan.cluster_name,
            region=self.region,
            serving_namespace=self.ray_service.props.namespace,
            log_groups=self.log_groups,
            addon_version=settings.addon_version,
        )
        for dependency in (self.eks.system_nodes, *self.eks.node_addons):
            self.observability.addon.node.add_dependency(dependency)
        self.ray_service.manifest.node.add_dependency(self.observability.addon)
        nat_gateway_ids = [
            child.ref for child in self.network.vpc.node.find_all() if isinstance(child, ec2.CfnNatGateway)
        ]
        self.dashboard = ServingDashboard(
            self,
            "Dashboard",
            cluster_name=plan.cluster_name,
            application_logs=self.observability.log_groups["application"],
            nat_gateway_ids=nat_gateway_ids,
            alarm_email=settings.alarm_email,
            api_keys=settings.api_keys,
        )

    def _end_capacity_blocks(self, plan: mapping.DeploymentPlan) -> None:
        """With a Capacity Block group: its scale-down before the block ends, and the warning ahead
        (to the alarms' topic when there is one)."""
        self.capacity_block_end: CapacityBlockEnd | None = None
        if not plan.capacity_blocks:
            return
        nodegroups = {group.group.name: group.nodegroup for group in self.gpu_node_groups}
        self.capacity_block_end = CapacityBlockEnd(
            self,
            "CapacityBlockEnd",
            cluster_name=plan.cluster_name,
            groups=[
                CapacityBlockGroup(
                    name=block.name, reservation_id=block.target, nodegroup_name=nodegroups[block.name].nodegroup_name
                )
                for block in plan.capacity_blocks
            ],
            capacity_check=self.capacity_check,
            log_groups=self.log_groups,
            topic=self.dashboard.topic if self.dashboard else None,
        )

    def _expose(self, config: DeploymentConfig) -> None:
        """NetworkPolicies in every exposure; with ``internal``, the controller and the NLB Service."""
        vpc, namespace = self.network.vpc, self.ray_service.props.namespace
        plan = mapping.endpoint_plan(
            config,
            service_name=endpoint_service_name(self.ray_service.props.name),
            namespace=namespace,
            private_subnets=vpc.select_subnets(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS).subnets,
            vpc_cidr=self.network.cidr,
        )
        self.serving_network = ServingNetwork(
            self,
            "ServingNetwork",
            props=ServingNetworkProps(
                namespace=namespace,
                operator_namespace=OPERATOR_NAMESPACE,
                nlb_subnet_cidrs=plan.policy_cidrs,
                metrics_scraper_namespace=observability.ADDON_NAMESPACE if self.observability else None,
                metrics_port=observability.RAY_METRICS_PORT,
                limit_egress=True,
                vpc_cidr=self.network.cidr,
                gcs_store_port=self.gcs_store.port if self.gcs_store else None,
            ),
            cluster=self.eks.handle,
            ray_service=self.ray_service,
        )
        self.load_balancer_controller: AwsLoadBalancerController | None = None
        self.internal_endpoint: InternalEndpoint | None = None
        if plan.service is None:
            return
        self.load_balancer_controller = AwsLoadBalancerController(
            self, "LoadBalancerController", cluster=self.eks.handle, vpc=vpc, region=self.region
        )
        self.load_balancer_controller.chart.node.add_dependency(self.eks.system_nodes)
        # The controller deletes the NLB on destroy, retrying ELBv2/EC2 calls for minutes: CoreDNS
        # stays until it is gone (an explicit edge, so the order is in the template).
        self.load_balancer_controller.chart.node.add_dependency(self.eks.core_dns)
        self.internal_endpoint = InternalEndpoint(
            self,
            "InternalEndpoint",
            props=plan.service,
            cluster=self.eks.handle,
            controller=self.load_balancer_controller,
            ray_service=self.ray_service,
        )

    def _refuse_other_region(self) -> None:
        """The image, the CloudWatch agent and the pods' AWS clients use the ``region`` setting; a
        stack deployed elsewhere would point them at the other region."""
        stack_region, setting = Stack.of(self).region, self.plan.stack_region_setting
        if setting and not Token.is_unresolved(stack_region) and stack_region != setting:
            raise ConstructError(
                self,
                "PdServingOtherRegion",
                f"region={setting!r} differs from the stack's own region {stack_region!r} "
                f"({Stack.of(self).node.path}). Fix: set region to {stack_region!r}, or leave it unset",
                setting="region",
            )

    def _refuse_duplicate_cluster_name(self) -> None:
        """Two deployments in one app must not share an EKS cluster name (it is physical)."""
        for other in self.node.root.node.find_all():
            if isinstance(other, PdServing) and other is not self and other.plan.cluster_name == self.plan.cluster_name:
                raise ConstructError(
                    self,
                    "PdServingDuplicateClusterName",
                    f"cluster_name={self.plan.cluster_name!r} is already used by {other.node.path} in this app. "
                    "Fix: give each deployment its own cluster_name",
                    setting="cluster_name",
                )


def _identity_description(pods: str, weights: bool, api_keys: bool, gcs_token: bool = False) -> str:
    reads = [
        what
        for what, wanted in (
            ("the staged model weights", weights),
            ("the API key secret", api_keys),
            ("the GCS store's token", gcs_token),
        )
        if wanted
    ]
    return f"{pods}: read {' and '.join(reads)}"
