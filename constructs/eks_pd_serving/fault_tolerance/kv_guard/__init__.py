"""Decode's KV guard (``eks_pd_kv_guard``, pod-side) and how it ships: its source goes into a
ConfigMap mounted on every GPU worker, on the pods' PYTHONPATH, and the workers' env names its
engine class (prefill's engine stands aside). The pod module imports Ray; its names are read here from
its text, so the package does not need Ray."""

from __future__ import annotations

from ..._private import pod_code

MODULE = "eks_pd_kv_guard"
FILE_NAME = f"{MODULE}.py"
MOUNT_PATH = "/opt/eks-pd/kv-guard"
# Ray Serve LLM 2.58 (core/server/llm_server.py): the engine class a replica builds, by import path.
ENGINE_CLS_ENV = "RAYLLM_VLLM_ENGINE_CLS"


_CODE = pod_code.Shipped(__file__, FILE_NAME)
source = _CODE.source
source_digest = _CODE.digest


_constant = _CODE.constant  # parsed once (pod_code.Shipped)


def engine_cls() -> str:
    return str(_constant("ENGINE_CLS"))


def mode_env() -> str:
    return str(_constant("MODE_ENV"))


def modes() -> tuple[str, ...]:
    return tuple(str(m) for m in _constant("MODES"))


def lines() -> dict[str, str]:
    """The lines the guard logs, by what they say: on, stands aside, tripped."""
    return {
        key: str(_constant(name))
        for key, name in (("on", "ON_LINE"), ("aside", "ASIDE_LINE"), ("tripped", "TRIPPED_LINE"))
    }


__all__ = [
    "ENGINE_CLS_ENV",
    "FILE_NAME",
    "MODULE",
    "MOUNT_PATH",
    "engine_cls",
    "lines",
    "mode_env",
    "modes",
    "source",
    "source_digest",
]
