"""The Ray Serve config (serveConfigV2) for prefill/decode disaggregation, built from the served
models (``ServedModel``).

With the failover, each phase of each model is a Serve application of its own and one ingress
application on ``/`` serves every model. Serve versions an application by its ``args`` (and its
import path, runtime env and a few override fields: ``APP_VERSION_FIELDS``), so a change of one
phase's engine restarts that phase alone while the failover serves through the other. What Serve
applies without restarting a replica (replica counts and autoscaling, the failover's settings as
``user_config``, shutdown and health-check timing) sits in each application's ``deployments:``
overrides, never in its args. Without the failover, Ray's ``build_pd_openai_app``: one application
holding both engines, which any change restarts together.

Both engines come from one model description, so they cannot disagree on the model. The KV
transfer settings sit inside ``engine_kwargs``: Ray Serve LLM 2.5x rejects a
``kv_transfer_config`` beside them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import yaml

from ..phase import PHASES, Phase
from .specs import EngineSpec, FailoverSpec, KvTransferSpec, ModelSpec, NodeCacheSpec, ServedModel, Weights

APP_NAME = "pd-openai"
IMPORT_PATH = "ray.serve.llm:build_pd_openai_app"
KV_CONNECTOR = "NixlConnector"
# Each phase's NIXL side channels from a port of its own: Ray's NIXL backend binds base + the
# replica's rank in its deployment (``kv_transfer/nixl.py``, ``experimental_configs``, default
# 20000 for both), so a prefill and a decode replica of rank 0 on one pod would both bind 20000;
# the loser's listener dies (seen in the CPU rehearsal once the phases were two applications).
NIXL_PORT_BASES = {Phase.PREFILL: 20000, Phase.DECODE: 21000}
# Each served model's engines from a window of their own inside their phase's range: two models'
# prefill replicas of rank 0 on one node (a node of several GPUs, or one host in the CPU rehearsal)
# would otherwise both bind the phase's base (the two-model rehearsal's second prefill lost its
# listener so). Ray adds rank x tensor-parallel size to the base: a window holds that many ports.
NIXL_MODEL_WINDOW = 100
NIXL_PHASE_RANGE = 1000


def nixl_port_base(phase: Phase, model_index: int) -> int:
    """The NIXL side-channel base of the ``model_index``-th served model's ``phase`` engines."""
    return NIXL_PORT_BASES[phase] + model_index * NIXL_MODEL_WINDOW


# Ray's deployment names: build_llm_deployment's prefix and the model id with "/" and "." replaced
# (``_get_deployment_name`` in ray/llm/_internal/serve/core/server/builder.py, Ray 2.58).
INGRESS_DEPLOYMENT = "OpenAiIngress"
#: The ingress's replicas (on any Ray pod with a CPU): two, so its own restart (a model added, a
#: model's max_model_len changed) stops one at a time and the proxies route to the other.
INGRESS_REPLICAS = 2
# What Serve 2.58 hashes into an application's code version (``get_app_code_version`` in
# serve/_private/deploy_utils.py): a change of any restarts every deployment of that application.
APP_VERSION_FIELDS = ("import_path", "runtime_env", "args")
APP_VERSION_OVERRIDES = ("request_router_config", "deployment_actors", "autoscaling_config.policy")


def deployment_config(engine: EngineSpec) -> dict[str, Any]:
    """Serve's deployment options for a phase inside Ray's own ``build_pd_openai_app``: a fixed
    count, or autoscaling between bounds (Ray Serve LLM leaves ``target_ongoing_requests`` at 1e9
    unless told, which never scales up); then the replica's shutdown and health-check timing,
    explicit on both phases."""
    scaling = engine.autoscaling
    replicas: dict[str, Any] = {"num_replicas": engine.replicas}
    if scaling is not None:
        replicas = {"autoscaling_config": _autoscaling(engine)}
    return {**replicas, **_timing(engine)}


def _autoscaling(engine: EngineSpec) -> dict[str, Any]:
    """The phase's replicas as Serve's ``autoscaling_config``: between bounds, or a fixed count as
    equal bounds. Always this one key, never ``num_replicas``: Serve hashes which overrides carry an
    autoscaling config into the application's version, so moving between fixed and autoscaling
    would restart the phase."""
    scaling = engine.autoscaling
    if scaling is None:
        return {"min_replicas": engine.replicas, "max_replicas": engine.replicas, "initial_replicas": engine.replicas}
    return {
        "min_replicas": scaling.min_replicas,
        "max_replicas": scaling.max_replicas,
        "target_ongoing_requests": scaling.target_ongoing_requests,
        "upscale_delay_s": scaling.upscale_delay_s,
        "downscale_delay_s": scaling.downscale_delay_s,
    }


def _timing(engine: EngineSpec) -> dict[str, Any]:
    return {
        "graceful_shutdown_timeout_s": engine.graceful_shutdown_timeout_s,
        "health_check_period_s": engine.health_check_period_s,
        "health_check_timeout_s": engine.health_check_timeout_s,
    }


def _kv_transfer_config(phase: Phase, kv: KvTransferSpec) -> dict[str, Any]:
    # No engine_id: Ray's NIXL backend then gives each engine start a fresh one (a random suffix,
    # host and port, engines/vllm/kv_transfer/nixl.py), so a restarted prefill is a new peer to
    # decode. A fixed id made the replacement on the same pod the dead peer's namesake.
    config: dict[str, Any] = {
        "kv_connector": KV_CONNECTOR,
        "kv_role": phase.kv_role,
        "kv_buffer_device": kv.buffer_device,
        "kv_connector_extra_config": {"backends": [kv.backend]},
    }
    if phase is Phase.DECODE:
        # Only the consumer loads KV: what it does with blocks it could not pull.
        config["kv_load_failure_policy"] = kv.load_failure_policy
    return config


def engine_source(weights: Weights, node_cache: NodeCacheSpec | None) -> str:
    """What an engine reads its weights from: the node's folder of a staged copy (with the node
    cache), the staged copy itself (Ray's S3 mirror), or the Hub's repository."""
    if weights.staged_uri and node_cache:
        return node_cache.weights_folder(weights)
    return weights.staged_uri or weights.repository


def build_llm_config(
    phase: Phase,
    model: ModelSpec,
    engine: EngineSpec,
    kv: KvTransferSpec,
    node_cache: NodeCacheSpec | None = None,
    *,
    replicas_in_args: bool = True,
    model_index: int = 0,
) -> dict[str, Any]:
    """One side's Ray Serve ``LLMConfig`` as a plain dict, its weights' paths derived here
    (``engine_source``). ``replicas_in_args``: its replicas and timing inside it (Ray's own
    builder); False: left to the application's overrides."""
    weights = model.weights
    from_hub = not weights.staged_uri
    config: dict[str, Any] = {
        "model_loading_config": {"model_id": model.model_id, "model_source": engine_source(weights, node_cache)},
        "deployment_config": deployment_config(engine) if replicas_in_args else {},
        "engine_kwargs": {
            "max_model_len": model.max_model_len,
            "dtype": model.dtype,
            "gpu_memory_utilization": model.gpu_memory_utilization,
            "enforce_eager": engine.enforce_eager,
            **({"quantization": engine.quantization} if engine.quantization else {}),
            **({"max_num_seqs": engine.max_num_seqs} if engine.max_num_seqs else {}),
            **({"max_num_batched_tokens": engine.max_num_batched_tokens} if engine.max_num_batched_tokens else {}),
            **({"language_model_only": True} if model.language_model_only else {}),
            **({"trust_request_chat_template": True} if model.trust_request_chat_template else {}),
            # The Hub's revision, pinned: without it both engines load the default branch at their own start.
            **({"revision": weights.revision} if from_hub and weights.revision else {}),
            "tensor_parallel_size": engine.tensor_parallel_size,
            "kv_transfer_config": _kv_transfer_config(phase, kv),
        },
    }
    if weights.staged_uri and node_cache:
        # Ray runs it on each node of the replica's placement group before the engine reads the folder.
        kwargs: dict[str, Any] = {"source": weights.staged_uri}
        compiled = node_cache.compiled_key(config)
        if compiled:  # in the staged copy's bucket: filled beside the weights, shared after a healthy start
            kwargs["compiled"] = compiled
        config["callback_config"] = {"callback_class": node_cache.fill_callback, "callback_kwargs": kwargs}
    config["experimental_configs"] = {"NIXL_SIDE_CHANNEL_PORT_BASE": nixl_port_base(phase, model_index)}
    if engine.placement_resource:
        # One bundle per tensor-parallel rank, each on a GPU of this phase's worker group.
        bundle = {"GPU": 1, engine.placement_resource: 1}
        config["placement_group_config"] = {"bundles": [bundle] * engine.tensor_parallel_size}
    return config


def build_pd_serving_args(
    model: ModelSpec,
    prefill: EngineSpec,
    decode: EngineSpec,
    kv: KvTransferSpec,
    node_cache: NodeCacheSpec | None = None,
) -> dict[str, Any]:
    """The ``args`` of ``build_pd_openai_app`` (Ray's ``PDServingArgs``)."""
    return {
        "prefill_config": build_llm_config(Phase.PREFILL, model, prefill, kv, node_cache),
        "decode_config": build_llm_config(Phase.DECODE, model, decode, kv, node_cache),
    }


def deployment_name(phase: Phase, model_id: str) -> str:
    """The phase's deployment as Ray's ``build_llm_deployment`` names it ("Prefill:", "Decode:")."""
    return f"{phase.title()}:" + model_id.replace("/", "--").replace(".", "_")


def app_name(served: ServedModel, phase: Phase) -> str:
    return f"{served.name}-{phase}"


def pair_key(model: ModelSpec, kv: KvTransferSpec, engine: EngineSpec) -> str:
    """What a phase's KV must agree on with the other's (model, weights, length, dtype, transfer,
    weight format), as a digest: prefill refuses a decode whose key differs (one phase updated
    before the other), so engines of different models or KV layouts are never paired. The weights
    by their words (repository@revision): where they are read from is no part of the KV."""
    agreed_model = {
        "model_id": model.model_id,
        "weights": model.weights.words,
        "max_model_len": model.max_model_len,
        "dtype": model.dtype,
        "gpu_memory_utilization": model.gpu_memory_utilization,
        "language_model_only": model.language_model_only,
    }
    agreed = {"model": agreed_model, "kv": asdict(kv), "quantization": engine.quantization}
    return hashlib.sha256(json.dumps(agreed, sort_keys=True).encode()).hexdigest()[:16]


def _failover_settings(failover: FailoverSpec) -> dict[str, Any]:
    return {
        "wait_s": failover.wait_s,
        "prefill_timeout_s": failover.prefill_timeout_s,
        "short_prompt_tokens": failover.short_prompt_tokens,
    }


def _phase_app(
    served: ServedModel, phase: Phase, failover: FailoverSpec, node_cache: NodeCacheSpec | None, index: int
) -> dict[str, Any]:
    engine = served.engine(phase)
    model, kv = served.model, served.kv
    llm = build_llm_config(phase, model, engine, kv, node_cache, replicas_in_args=False, model_index=index)
    args: dict[str, Any] = {
        "llm_config": llm,
        "pair": pair_key(model, kv, engine),
    }
    if failover.covered:
        args["covered"] = [list(pair) for pair in failover.covered]
    overrides: dict[str, Any] = {
        "name": deployment_name(phase, model.model_id),
        "autoscaling_config": _autoscaling(engine),
        **_timing(engine),
    }
    if phase is Phase.DECODE:
        prefill = Phase.PREFILL
        args[prefill.value] = {"app": app_name(served, prefill), "deployment": deployment_name(prefill, model.model_id)}
        overrides["user_config"] = _failover_settings(failover)
    return {
        "name": app_name(served, phase),
        "import_path": failover.import_paths[phase],
        "route_prefix": None,
        "args": args,
        "deployments": [overrides],
    }


def _ingress_app(models: Sequence[ServedModel], failover: FailoverSpec) -> dict[str, Any]:
    entries = [
        {
            "model_id": served.model.model_id,
            "max_model_len": served.model.max_model_len,
            "adapters": False,
            **({"trust_request_chat_template": True} if served.model.trust_request_chat_template else {}),
            **{
                phase.value: {
                    "app": app_name(served, phase),
                    "deployment": deployment_name(phase, served.model.model_id),
                }
                for phase in reversed(PHASES)  # decode first, as the ingress reads them
            },
        }
        for served in models
    ]
    replicas = dict.fromkeys(("min_replicas", "max_replicas", "initial_replicas"), INGRESS_REPLICAS)
    return {
        "name": APP_NAME,
        "import_path": failover.import_paths["ingress"],
        "route_prefix": "/",
        "args": {"models": entries},
        "deployments": [
            {"name": INGRESS_DEPLOYMENT, "autoscaling_config": replicas, "user_config": _failover_settings(failover)}
        ],
    }


def build_serve_config(models: Sequence[ServedModel], node_cache: NodeCacheSpec | None = None) -> dict[str, Any]:
    """The whole Serve config. Models with failover: each phase its own application (every prefill,
    every decode, the order a change is rolled in: ``rollout.rollout_steps``), and one ingress on ``/``
    (the first model's failover settings).
    Without: Ray's ``build_pd_openai_app``, one application on ``/`` (one model only).
    ``node_cache``: the GPU workers' node cache, from which a staged model's engines read."""
    if not models:
        raise ValueError("RayServiceProps.models: at least one served model")
    names = [served.name for served in models]
    if len(set(names)) != len(names):
        raise ValueError(f"RayServiceProps.models: each model's name must be unique, got {names}")
    ids = [served.model.model_id for served in models]
    if len(set(ids)) != len(ids):
        raise ValueError(f"RayServiceProps.models: each model_id must be unique (the ingress routes by it), got {ids}")
    failover = models[0].failover
    if failover is None:
        if len(models) > 1:
            raise ValueError("RayServiceProps.models: several models need the failover (Ray's builder serves one)")
        served = models[0]
        args = build_pd_serving_args(served.model, served.prefill, served.decode, served.kv, node_cache)
        return {"applications": [{"name": APP_NAME, "import_path": IMPORT_PATH, "route_prefix": "/", "args": args}]}
    if any(served.failover is None for served in models):
        raise ValueError("RayServiceProps.models: give every model the failover, or serve one model without it")
    if len(models) * NIXL_MODEL_WINDOW > NIXL_PHASE_RANGE:
        raise ValueError(
            f"RayServiceProps.models: {len(models)} models; each phase's NIXL ports hold "
            f"{NIXL_PHASE_RANGE // NIXL_MODEL_WINDOW}. Fix: serve at most that many models in one RayService"
        )
    for served in models:
        for phase in PHASES:
            engine = served.engine(phase)
            ports = engine.most_replicas * engine.tensor_parallel_size
            if ports > NIXL_MODEL_WINDOW:
                raise ValueError(
                    f"RayServiceProps.models: {served.model.model_id}'s {phase} needs {ports} NIXL ports (replicas x "
                    f"tensor_parallel_size), its window holds {NIXL_MODEL_WINDOW}. Fix: fewer replicas"
                )
    phases = [
        _phase_app(served, phase, failover, node_cache, index)
        for phase in PHASES
        for index, served in enumerate(models)
    ]
    return {"applications": [*phases, _ingress_app(models, failover)]}


def to_yaml(serve_config: dict[str, Any]) -> str:
    """Stable YAML: key order as built, so ``cdk diff`` only moves when a value does."""
    return yaml.safe_dump(serve_config, sort_keys=False, default_flow_style=False)


# Readers of a built serve config, either layout (the rehearsals and the CLI take the deployed one).
_KV_PHASES = {phase.kv_role: phase for phase in PHASES}


def phase_llm_configs(serve_config: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every engine's LLMConfig dict with its phase (by its KV role), in the config's order."""
    found = []
    for app in serve_config["applications"]:
        args = app.get("args") or {}
        for llm in (args.get("prefill_config"), args.get("decode_config"), args.get("llm_config")):
            if isinstance(llm, dict):
                role = llm["engine_kwargs"].get("kv_transfer_config", {}).get("kv_role", "")
                found.append((_KV_PHASES.get(role, "colocated"), llm))
    return found


def llm_config(serve_config: dict[str, Any], phase: Phase) -> dict[str, Any]:
    """The first model's ``phase`` engine's LLMConfig dict."""
    return next(llm for found, llm in phase_llm_configs(serve_config) if found == phase)


def replica_options(serve_config: dict[str, Any], phase: Phase) -> dict[str, Any]:
    """Where the first model's ``phase`` replicas are set: its app's deployment override (the
    failover's layout) or its LLMConfig's ``deployment_config`` (Ray's builder)."""
    llm = llm_config(serve_config, phase)
    name = deployment_name(phase, llm["model_loading_config"]["model_id"])
    for app in serve_config["applications"]:
        for override in app.get("deployments") or []:
            if override.get("name") == name:
                return dict(override)
    return dict(llm["deployment_config"])


def failover_settings(serve_config: dict[str, Any]) -> list[dict[str, Any]]:
    """The failover's settings as the config holds them (each deployment's ``user_config`` that
    carries them); empty without the failover."""
    return [
        override["user_config"]
        for app in serve_config["applications"]
        for override in app.get("deployments") or []
        if isinstance(override.get("user_config"), dict) and "wait_s" in override["user_config"]
    ]


def replica_title(serve_config: dict[str, Any], phase: Phase) -> str:
    """The first model's ``phase`` replicas' process title prefix (``ServeReplica:<app>:<deployment>``)."""
    for app in serve_config["applications"]:
        for found, llm in phase_llm_configs({"applications": [app]}):
            if found == phase:
                return f"ServeReplica:{app['name']}:{deployment_name(phase, llm['model_loading_config']['model_id'])}"
    raise ValueError(f"no {phase} engine in the serve config")
