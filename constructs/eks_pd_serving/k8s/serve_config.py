"""The Ray Serve application (serveConfigV2) for prefill/decode disaggregation.

Both engines come from one model description, so they cannot disagree on the model. The KV
transfer settings sit inside ``engine_kwargs``: Ray Serve LLM 2.5x rejects a
``kv_transfer_config`` beside them.
"""

from __future__ import annotations

from typing import Any

import yaml

from .specs import EngineSpec, FailoverSpec, KvTransferSpec, ModelSpec

APP_NAME = "pd-openai"
IMPORT_PATH = "ray.serve.llm:build_pd_openai_app"
KV_CONNECTOR = "NixlConnector"
# vLLM >= 0.30 deprecates kv_both for NixlConnector: prefill produces, decode consumes.
_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer"}


def deployment_config(engine: EngineSpec) -> dict[str, Any]:
    """Serve's deployment options: a fixed count, or autoscaling between bounds (Ray Serve LLM
    leaves ``target_ongoing_requests`` at 1e9 unless told, which never scales up); then the
    replica's shutdown and health-check timing, explicit on both phases."""
    scaling = engine.autoscaling
    replicas: dict[str, Any] = {"num_replicas": engine.replicas}
    if scaling is not None:
        replicas = {
            "autoscaling_config": {
                "min_replicas": scaling.min_replicas,
                "max_replicas": scaling.max_replicas,
                "target_ongoing_requests": scaling.target_ongoing_requests,
                "upscale_delay_s": scaling.upscale_delay_s,
                "downscale_delay_s": scaling.downscale_delay_s,
            }
        }
    return {
        **replicas,
        "graceful_shutdown_timeout_s": engine.graceful_shutdown_timeout_s,
        "health_check_period_s": engine.health_check_period_s,
        "health_check_timeout_s": engine.health_check_timeout_s,
    }


def _kv_transfer_config(phase: str, kv: KvTransferSpec) -> dict[str, Any]:
    # No engine_id: Ray's NIXL backend then gives each engine start a fresh one (a random suffix,
    # host and port, engines/vllm/kv_transfer/nixl.py), so a restarted prefill is a new peer to
    # decode. A fixed id made the replacement on the same pod the dead peer's namesake.
    config: dict[str, Any] = {
        "kv_connector": KV_CONNECTOR,
        "kv_role": _ROLES[phase],
        "kv_buffer_device": kv.buffer_device,
        "kv_connector_extra_config": {"backends": [kv.backend]},
    }
    if phase == "decode":
        # Only the consumer loads KV: what it does with blocks it could not pull.
        config["kv_load_failure_policy"] = kv.load_failure_policy
    return config


def build_llm_config(phase: str, model: ModelSpec, engine: EngineSpec, kv: KvTransferSpec) -> dict[str, Any]:
    """One side's Ray Serve ``LLMConfig`` as a plain dict."""
    config: dict[str, Any] = {
        "model_loading_config": {"model_id": model.model_id, "model_source": model.model_source},
        "deployment_config": deployment_config(engine),
        "engine_kwargs": {
            "max_model_len": model.max_model_len,
            "dtype": model.dtype,
            "gpu_memory_utilization": model.gpu_memory_utilization,
            "enforce_eager": engine.enforce_eager,
            **({"quantization": engine.quantization} if engine.quantization else {}),
            **({"max_num_seqs": engine.max_num_seqs} if engine.max_num_seqs else {}),
            **({"max_num_batched_tokens": engine.max_num_batched_tokens} if engine.max_num_batched_tokens else {}),
            **({"language_model_only": True} if model.language_model_only else {}),
            "tensor_parallel_size": engine.tensor_parallel_size,
            "kv_transfer_config": _kv_transfer_config(phase, kv),
        },
    }
    if engine.placement_resource:
        # One bundle per tensor-parallel rank, each on a GPU of this phase's worker group.
        bundle = {"GPU": 1, engine.placement_resource: 1}
        config["placement_group_config"] = {"bundles": [bundle] * engine.tensor_parallel_size}
    return config


def build_pd_serving_args(
    model: ModelSpec, prefill: EngineSpec, decode: EngineSpec, kv: KvTransferSpec
) -> dict[str, Any]:
    """The ``args`` of ``build_pd_openai_app`` (Ray's ``PDServingArgs``)."""
    return {
        "prefill_config": build_llm_config("prefill", model, prefill, kv),
        "decode_config": build_llm_config("decode", model, decode, kv),
    }


def build_serve_config(pd_serving_args: dict[str, Any], failover: FailoverSpec | None = None) -> dict[str, Any]:
    """The whole Serve config: one application on route ``/``. With ``failover``, its builder
    (the same args, plus its own under ``failover.args_key``); without, Ray's ``build_pd_openai_app``."""
    args = pd_serving_args
    if failover is not None:
        args = {
            **pd_serving_args,
            failover.args_key: {
                "wait_s": failover.wait_s,
                "prefill_timeout_s": failover.prefill_timeout_s,
                "short_prompt_tokens": failover.short_prompt_tokens,
            },
        }
    return {
        "applications": [
            {
                "name": APP_NAME,
                "import_path": failover.import_path if failover else IMPORT_PATH,
                "route_prefix": "/",
                "args": args,
            }
        ]
    }


def to_yaml(serve_config: dict[str, Any]) -> str:
    """Stable YAML: key order as built, so ``cdk diff`` only moves when a value does."""
    return yaml.safe_dump(serve_config, sort_keys=False, default_flow_style=False)
