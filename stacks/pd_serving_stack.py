"""The one stack `cdk deploy` creates: the PdServing construct plus the commands a user runs next."""

from __future__ import annotations

from typing import Any

from aws_cdk import Aws, CfnOutput, Stack
from constructs import Construct

from eks_pd_serving.config import DeploymentConfig
from eks_pd_serving.k8s.specs import SERVE_PORT
from eks_pd_serving.pd_serving import PdServing


class PdServingStack(Stack):
    def __init__(self, scope: Construct, id: str, *, config: DeploymentConfig, **kwargs: Any) -> None:
        super().__init__(scope, id, **kwargs)
        self.serving = PdServing(self, "PdServing", config=config)
        props = self.serving.ray_service.props
        region = config.region or Aws.REGION
        admin_role_arn = self.serving.eks.admin_role_arn
        CfnOutput(self, "ClusterName", value=config.cluster_name)
        CfnOutput(self, "ClusterAdminRoleArn", value=admin_role_arn)
        # kubectl then authenticates as the admin role (aws eks get-token --role-arn): the
        # person running it needs sts:AssumeRole on it, nothing in the cluster.
        CfnOutput(
            self,
            "UpdateKubeconfigCommand",
            value=(
                f"aws eks update-kubeconfig --name {config.cluster_name} --region {region} --role-arn {admin_role_arn}"
            ),
        )
        CfnOutput(
            self,
            "PortForwardCommand",
            value=(
                f"kubectl -n {props.namespace} port-forward svc/{props.serve_service_name} {SERVE_PORT}:{SERVE_PORT}"
            ),
        )
        endpoint = self.serving.internal_endpoint
        if endpoint is not None:
            # The NLB exists only once the controller has reconciled the Service, after deploy:
            # its DNS name is read from the Service (`python -m eks_pd_serving verify` prints it).
            CfnOutput(
                self,
                "InternalEndpointAddressCommand",
                value=(
                    f"kubectl -n {endpoint.props.namespace} get service {endpoint.props.name} "
                    "-o jsonpath='{.status.loadBalancer.ingress[0].hostname}'"
                ),
            )
        dashboard = self.serving.dashboard
        if dashboard is not None:
            name = dashboard.dashboard.dashboard_name
            CfnOutput(
                self,
                "DashboardUrl",
                value=f"https://{region}.console.aws.amazon.com/cloudwatch/home?region={region}#dashboards/dashboard/{name}",
            )
        if self.serving.gcs_store is not None:
            # `verify` asks ElastiCache for this group's state (the head's GCS store).
            CfnOutput(self, "GcsStoreId", value=self.serving.gcs_store.replication_group_id)
        keys = self.serving.api_keys
        auth = ""
        if keys is not None:
            CfnOutput(self, "ApiKeysSecretArn", value=keys.secret_arn)
            # The command prints the first key; applications get their own (docs/features/api-keys.md).
            CfnOutput(
                self,
                "ApiKeyCommand",
                value=(
                    f"aws secretsmanager get-secret-value --region {region} --secret-id {keys.secret_arn} "
                    "--query SecretString --output text "
                    "| python3 -c 'import json,sys; print(next(iter(json.load(sys.stdin).values())))'"
                ),
            )
            auth = '-H "Authorization: Bearer $API_KEY" '
        CfnOutput(
            self,
            "ChatCompletionsCurl",
            value=(
                f"curl -s http://localhost:{SERVE_PORT}/v1/chat/completions "
                f"{auth}-H 'Content-Type: application/json' "
                f"""-d '{{"model": "{props.models[0].model.model_id}", "messages": """
                """[{"role": "user", "content": "Hello"}], "max_tokens": 64}'"""
            ),
        )
