"""The model's weights staged in the stack's S3 bucket (weights_source=s3)."""

from __future__ import annotations

from .model_weights import ModelWeights, weights_prefix

__all__ = ["ModelWeights", "weights_prefix"]
