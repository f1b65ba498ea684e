"""What synth knows offline: instance types (instances.py), models (models.py, configs/) and prices (prices.py)."""

from __future__ import annotations

from .instances import (
    GPU_MEMORY_BANDWIDTH_GBPS,
    GPUS,
    INSTANCE_TYPES,
    EfaInterface,
    GpuFacts,
    InstanceFacts,
    efa_plugin_instance_types,
    gpu_slug,
    mismatches,
)
from .models import CATALOG, CONFIGS, DENSE, GATED, HYBRID, MODELS, MOE, CatalogEntry, ModelFacts, facts_from_config

# CloudWatch Logs accepts only these retention periods, days (PutRetentionPolicy).
LOG_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922,
                      3288, 3653)  # fmt: skip

__all__ = [
    "CATALOG",
    "CONFIGS",
    "DENSE",
    "GATED",
    "GPUS",
    "GPU_MEMORY_BANDWIDTH_GBPS",
    "HYBRID",
    "INSTANCE_TYPES",
    "LOG_RETENTION_DAYS",
    "MODELS",
    "MOE",
    "CatalogEntry",
    "EfaInterface",
    "GpuFacts",
    "InstanceFacts",
    "ModelFacts",
    "efa_plugin_instance_types",
    "facts_from_config",
    "gpu_slug",
    "mismatches",
]
