"""The model's weights: staged in the stack's S3 bucket (``model_weights``, weights_source=s3: the
staging job's script ``job`` and the custom resource's ``handler``) and kept on each GPU node
(``node_cache``: pod-side code and how it ships, no CloudFormation). Imported lazily, so the node
cache's face needs no CDK."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .model_weights import ModelWeights, weights_prefix

__all__ = ["ModelWeights", "weights_prefix"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module(".model_weights", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
