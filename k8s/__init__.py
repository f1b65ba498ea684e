"""cdk8s charts. Nothing here knows about CloudFormation: charts take plain typed props."""

from .ray_service import RayServiceChart
from .serve_config import build_pd_serving_args, build_serve_config
from .specs import EngineSpec, KvTransferSpec, ModelSpec, PodResources, RayServiceProps, WorkerGroupSpec

__all__ = [
    "EngineSpec",
    "KvTransferSpec",
    "ModelSpec",
    "PodResources",
    "RayServiceChart",
    "RayServiceProps",
    "WorkerGroupSpec",
    "build_pd_serving_args",
    "build_serve_config",
]
