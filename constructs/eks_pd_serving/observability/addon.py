"""The Amazon CloudWatch Observability EKS add-on: Container Insights with enhanced observability
(GPU metrics from its DCGM exporter, EFA metrics), container logs (Fluent Bit), and one more
CloudWatch agent that scrapes the Ray pods' Prometheus endpoint (``agent``).

Its agents authenticate with EKS Pod Identity (the add-on's own association, add-on v3.1.0 and
later) as a role carrying AWS's ``CloudWatchAgentServerPolicy``, the policy AWS documents for the
add-on. The log groups it writes to are the stack's, created before it: otherwise Fluent Bit and
the agent create them on first write (``auto_create_group``), with no retention, and they outlive
``cdk destroy``.
"""

from __future__ import annotations

from aws_cdk import Stack
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct

from .. import versions
from .._private import nag
from .._private.pod_identity import pod_identity_service_role
from ..log_groups import LogGroups
from . import agent
from . import catalogue as om

AGENT_POLICY = "CloudWatchAgentServerPolicy"


class CloudWatchObservability(Construct):
    """:param cluster: the cluster (its name is the Container Insights ClusterName).
    :param cluster_name: the cluster's name as configured (log group names need it at synth).
    :param region: the region the agents publish to.
    :param serving_namespace: the namespace whose Ray pods are scraped.
    :param log_groups: creates the groups the add-on writes to (their retention and key).
    :param addon_version: the add-on version. Default: versions.CLOUDWATCH_OBSERVABILITY_ADDON_VERSION.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        cluster: eks.ICluster,
        cluster_name: str,
        region: str,
        serving_namespace: str,
        log_groups: LogGroups,
        addon_version: str = versions.CLOUDWATCH_OBSERVABILITY_ADDON_VERSION,
    ) -> None:
        super().__init__(scope, id)
        self.log_groups: dict[str, logs.LogGroup] = {
            kind: log_groups.group(self, f"{kind.capitalize()}Logs", log_group_name=name)
            for kind, name in om.log_group_names(cluster_name).items()
        }
        self.role = pod_identity_service_role(
            self,
            policy_arn=iam.ManagedPolicy.from_aws_managed_policy_name(AGENT_POLICY).managed_policy_arn,
            description=f"CloudWatch agents and Fluent Bit in {cluster_name} (EKS Pod Identity)",
            session=(cluster_name, om.ADDON_NAMESPACE, om.SERVICE_ACCOUNT),
        )
        nag.acknowledge(
            self.role,
            {
                nag.managed_policy(AGENT_POLICY): (
                    "AWS documents this managed policy for the CloudWatch Observability add-on's agents "
                    "(PutMetricData, PutLogEvents, CreateLogStream and the describes they need); AWS maintains it."
                )
            },
        )
        self.configuration = agent.addon_configuration(
            cluster_name=cluster_name, region=region, namespace=serving_namespace
        )
        self.addon = eks.CfnAddon(
            self,
            "Addon",
            addon_name=om.ADDON_NAME,
            addon_version=addon_version,
            cluster_name=cluster.cluster_name,
            configuration_values=Stack.of(self).to_json_string(self.configuration),
            pod_identity_associations=[
                eks.CfnAddon.PodIdentityAssociationProperty(
                    service_account=om.SERVICE_ACCOUNT, role_arn=self.role.role_arn
                )
            ],
            # The stack's values win over any edit made in the cluster.
            resolve_conflicts="OVERWRITE",
        )
        for group in self.log_groups.values():
            self.addon.node.add_dependency(group)
