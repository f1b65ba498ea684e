"""cdk8s charts that take plain typed props and know nothing of CloudFormation or of the features
(the pods' programs arrive as data)."""

from .network import (
    EndpointServiceChart,
    EndpointServiceProps,
    MetricsAccessChart,
    ServingNetworkChart,
    ServingNetworkProps,
)
from .ray_service import RayNamespaceChart, RayServiceChart
from .rollout import RolloutChart, RolloutSpec
from .serve_config import build_pd_serving_args, build_serve_config
from .specs import (
    ApiKeysSpec,
    EngineSpec,
    FailoverSpec,
    GcsFaultToleranceSpec,
    InitProgram,
    KvGuardSpec,
    KvTransferSpec,
    ModelSpec,
    PodProgram,
    PodResources,
    ProxyHook,
    RayAutoscalerSpec,
    RayServiceProps,
    ReplicaAutoscaling,
    WorkerGroupSpec,
)

__all__ = [
    "ApiKeysSpec",
    "EndpointServiceChart",
    "EndpointServiceProps",
    "EngineSpec",
    "FailoverSpec",
    "GcsFaultToleranceSpec",
    "InitProgram",
    "KvGuardSpec",
    "KvTransferSpec",
    "MetricsAccessChart",
    "ModelSpec",
    "PodProgram",
    "PodResources",
    "ProxyHook",
    "RayAutoscalerSpec",
    "RayNamespaceChart",
    "RayServiceChart",
    "RayServiceProps",
    "ReplicaAutoscaling",
    "RolloutChart",
    "RolloutSpec",
    "ServingNetworkChart",
    "ServingNetworkProps",
    "WorkerGroupSpec",
    "build_pd_serving_args",
    "build_serve_config",
]
