"""cdk8s charts. Nothing here knows about CloudFormation: charts take plain typed props."""

from .ray_service import (
    EngineSpec,
    KvTransferSpec,
    ModelSpec,
    PodResources,
    RayServiceChart,
    RayServiceProps,
    WorkerGroupSpec,
)
from .serve_config import build_pd_serving_args, build_serve_config

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
