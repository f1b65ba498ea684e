"""The PD pair's failover (``eks_pd_failover``, pod-side) and how it ships: its source goes into a
ConfigMap mounted on the Ray head and every GPU worker, on the pods' PYTHONPATH, and the serve
config's import paths name its builders (the build and the ingress may run on any Ray pod). The pod
module imports Ray; its names are read here from its text, so the package does not need Ray.
``upstream`` (not shipped) records the Ray code it overrides and the Ray and vLLM pairs that record
covers, which the phases get as args."""

from __future__ import annotations

from ..._private import pod_code

MODULE = "eks_pd_failover"
FILE_NAME = f"{MODULE}.py"
MOUNT_PATH = "/opt/eks-pd/failover"


_CODE = pod_code.Shipped(__file__, FILE_NAME)
source = _CODE.source
source_digest = _CODE.digest


_constant = _CODE.constant  # parsed once (pod_code.Shipped)


def import_paths() -> dict[str, str]:
    """Each application's builder by role: prefill, decode, ingress."""
    return {str(k): str(v) for k, v in _constant("IMPORT_PATHS").items()}


def args_key() -> str:
    return str(_constant("ARGS_KEY"))


def metric() -> str:
    return str(_constant("METRIC"))


def paths() -> tuple[str, ...]:
    return tuple(str(p) for p in _constant("PATHS"))


def cooldown_s() -> float:
    return float(_constant("COOLDOWN_S"))


def poisoned_type() -> str:
    """The error type of a request whose dispatch ended in its engine's death (not replayed)."""
    return str(_constant("POISONED_TYPE"))


__all__ = [
    "FILE_NAME",
    "MODULE",
    "MOUNT_PATH",
    "args_key",
    "cooldown_s",
    "import_paths",
    "metric",
    "paths",
    "poisoned_type",
    "source",
    "source_digest",
]
