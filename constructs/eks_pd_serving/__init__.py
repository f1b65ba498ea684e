"""Prefill/decode-disaggregated LLM serving on Amazon EKS, as AWS CDK constructs.

    from eks_pd_serving import DeploymentConfig, PdServing
    PdServing(stack, "PdServing", config=DeploymentConfig.create(gpu_node_count=4))

Names are imported lazily, so plain-JSON modules (``eks_pd_serving.assembly``) load without
aws-cdk-lib (the CPU rehearsal's virtualenv relies on that).
"""

from __future__ import annotations

from importlib import import_module, metadata
from typing import Any

try:
    __version__ = metadata.version("eks-pd-serving")
except metadata.PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+source"

# The public API: name -> the module that defines it (imported on first use).
_EXPORTS = {
    "ConfigError": "config",
    "ConstructError": "config",
    "DeploymentConfig": "config",
    "PdServing": "pd_serving",
    # Each construct alone, with its props.
    "Network": "network",
    "LogGroups": "log_groups",
    "GpuCapacityCheck": "capacity_check",
    "CapacityBlockEnd": "capacity_block_end",
    "CapacityBlockGroup": "capacity_block_end",
    "EksCluster": "cluster",
    "EksClusterProps": "cluster",
    "EfaGpuNodeGroup": "gpu_node_group",
    "GpuGroup": "layout",
    "KubeRayOperator": "kuberay_operator",
    "GpuDevicePlugins": "device_plugins",
    "ClusterAutoscaler": "cluster_autoscaler",
    "RayServiceManifest": "ray_service",
    "RayServiceProps": "k8s",
    "ServingNetwork": "endpoint.serving_network",
    "AwsLoadBalancerController": "endpoint.load_balancer_controller",
    "InternalEndpoint": "endpoint.internal_endpoint",
    "CloudWatchObservability": "observability.addon",
    "ServingDashboard": "observability.dashboard",
    "ModelWeights": "weights.model_weights",
    "ApiKeys": "endpoint.api_keys",
    "GcsStore": "fault_tolerance.gcs_store",
}
__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
