"""The PD pair's failover (``eks_pd_failover``, pod-side) and how it ships: its source goes into a
ConfigMap mounted on the Ray head and every GPU worker, on the pods' PYTHONPATH, and the serve
config's import paths name its builders (the build and the ingress may run on any Ray pod). The pod
module imports Ray; its names are read here from its text, so the package does not need Ray."""

from __future__ import annotations

from functools import cache

from ..._private import pod_code

MODULE = "eks_pd_failover"
FILE_NAME = f"{MODULE}.py"
MOUNT_PATH = "/opt/eks-pd/failover"


def source() -> str:
    """The module's text, exactly as the pods import it."""
    return pod_code.source(__file__, FILE_NAME)


def source_digest() -> str:
    """Short digest of the source: a pod annotation, so new code restarts the pods on purpose."""
    return pod_code.digest(source())


@cache
def _constant(name: str) -> object:
    return pod_code.constant(source(), FILE_NAME, name)


def import_paths() -> dict[str, str]:
    """Each application's builder by role: prefill, decode, ingress."""
    return {str(k): str(v) for k, v in _constant("IMPORT_PATHS").items()}  # type: ignore[attr-defined]


def args_key() -> str:
    return str(_constant("ARGS_KEY"))


def metric() -> str:
    return str(_constant("METRIC"))


def paths() -> tuple[str, ...]:
    return tuple(str(p) for p in _constant("PATHS"))  # type: ignore[attr-defined]


def cooldown_s() -> float:
    return float(_constant("COOLDOWN_S"))  # type: ignore[arg-type]


__all__ = [
    "FILE_NAME",
    "MODULE",
    "MOUNT_PATH",
    "args_key",
    "cooldown_s",
    "import_paths",
    "metric",
    "paths",
    "source",
    "source_digest",
]
