"""cdk8s charts that take plain typed props and know nothing of CloudFormation or of the features
(the pods' programs arrive as data): the props (``specs``), the serve config (``serve_config``), the
GPUs every served model needs against the worker groups (``gpu_accounting``), the
RayService and its namespace (``ray_service``), the rollout Jobs (``rollout``), the network policies
and endpoint Service (``network``) and the names ``verify`` looks for (``names``)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
        NodeCacheSpec,
        PodProgram,
        PodResources,
        ProxyHook,
        RayAutoscalerSpec,
        RayServiceProps,
        ReplicaAutoscaling,
        ServedModel,
        Weights,
        WorkerGroupSpec,
    )

# Imported when first asked for: the plain specs and the serve config need no cdk8s (the rehearsal
# and the CLI read them without starting Node).
_MODULES = {
    "ApiKeysSpec": "specs",
    "EndpointServiceChart": "network",
    "EndpointServiceProps": "network",
    "EngineSpec": "specs",
    "FailoverSpec": "specs",
    "GcsFaultToleranceSpec": "specs",
    "InitProgram": "specs",
    "KvGuardSpec": "specs",
    "KvTransferSpec": "specs",
    "MetricsAccessChart": "network",
    "ModelSpec": "specs",
    "NodeCacheSpec": "specs",
    "PodProgram": "specs",
    "PodResources": "specs",
    "ProxyHook": "specs",
    "RayAutoscalerSpec": "specs",
    "RayNamespaceChart": "ray_service",
    "RayServiceChart": "ray_service",
    "RayServiceProps": "specs",
    "ReplicaAutoscaling": "specs",
    "RolloutChart": "rollout",
    "RolloutSpec": "rollout",
    "ServedModel": "specs",
    "ServingNetworkChart": "network",
    "ServingNetworkProps": "network",
    "Weights": "specs",
    "WorkerGroupSpec": "specs",
    "build_pd_serving_args": "serve_config",
    "build_serve_config": "serve_config",
}


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_MODULES[name]}", __name__), name)


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
    "NodeCacheSpec",
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
    "ServedModel",
    "ServingNetworkChart",
    "ServingNetworkProps",
    "Weights",
    "WorkerGroupSpec",
    "build_pd_serving_args",
    "build_serve_config",
]
