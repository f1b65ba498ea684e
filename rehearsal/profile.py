"""From the synthesized RayService to the serve config the rehearsal runs.

The deployed config is read out of the CloudFormation template `cdk synth` wrote, not rebuilt,
so the rehearsal runs what `cdk deploy` would apply. The local profile below is the only change,
and every change is printed as a diff.
"""

from __future__ import annotations

import copy
import difflib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from eks_pd_serving.assembly import kubernetes_objects
from eks_pd_serving.endpoint import proxy
from eks_pd_serving.fault_tolerance import failover, kv_guard
from eks_pd_serving.k8s import serve_config as serve_config_module
from eks_pd_serving.phase import Phase
from eks_pd_serving.weights import node_cache
from eks_pd_serving.weights.node_cache import eks_pd_node_cache as node_cache_fill

# The pod annotations holding the programs' digests (mapping.KV_GUARD_CODE, mapping.FAILOVER_CODE:
# the rehearsal imports no CDK).
KV_GUARD_CODE = "eks-pd-serving/kv-guard-code"
FAILOVER_CODE = "eks-pd-serving/failover-code"
NODE_CACHE_CODE = "eks-pd-serving/node-cache-code"
API_KEYS_CODE = "eks-pd-serving/api-keys-code"
# The GPU node's disk (node_cache.CACHE_PATH in the pods) on this machine: the weights' copies and
# the compile caches land here, as on a node, and outlive the run as they outlive a pod.
LOCAL_NODE_CACHE = Path(tempfile.gettempdir()) / "eks-pd-rehearsal-node-cache"

LOCAL_MAX_MODEL_LEN = 512
# Host staging and UCX: NIXL's LIBFABRIC plugin needs CUDA and EFA, neither of which is here.
LOCAL_KV_BACKEND = "UCX"
LOCAL_KV_BUFFER_DEVICE = "cpu"
# Autoscaled configs keep their bounds and target; Serve acts on a burst after this long instead of
# the deployed 30 s, so the rehearsal stays bounded in time.
LOCAL_UPSCALE_DELAY_S = 2.0
# Worker env that only makes sense on an EFA pod; VLLM_HOST_IP becomes loopback.
_POD_ONLY_ENV = {"FI_PROVIDER"}


def ray_service_from_template(template_file: Path, region: str = "us-east-1") -> dict[str, Any]:
    for document in kubernetes_objects(json.loads(template_file.read_text()), region):
        if document.get("kind") == "RayService":
            return dict(document)
    raise ValueError(f"no RayService manifest in {template_file}")


def serve_config(ray_service: dict[str, Any]) -> dict[str, Any]:
    return dict(yaml.safe_load(ray_service["spec"]["serveConfigV2"]))


def worker_env(ray_service: dict[str, Any]) -> dict[str, str]:
    """The Ray worker container's literal env, minus what only an EFA pod needs. Its PYTHONPATH
    names the pods' mounted programs: the KV guard's, the failover's, the node cache's and the proxy
    checks' mounts become the package's folders holding the same files (each pod annotation's digest
    is checked against its file), and this process's own PYTHONPATH follows."""
    (group, *_) = ray_service["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    template = group["template"]
    (container,) = template["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    env = {k: on_this_machine(v) for k, v in env.items() if k not in _POD_ONLY_ENV}
    env["VLLM_HOST_IP"] = "127.0.0.1"
    folders = []
    programs = {
        kv_guard.MOUNT_PATH: (kv_guard, KV_GUARD_CODE),
        failover.MOUNT_PATH: (failover, FAILOVER_CODE),
        node_cache.MOUNT_PATH: (node_cache, NODE_CACHE_CODE),
        proxy.MOUNT_PATH: (proxy, API_KEYS_CODE),
    }
    for folder in env.pop("PYTHONPATH", "").split(":"):
        if folder in programs:
            code, annotation = programs[folder]
            annotated = template.get("metadata", {}).get("annotations", {}).get(annotation)
            if annotated != code.source_digest():
                raise ValueError(
                    f"the template's {code.MODULE} code ({annotated}) is not this package's: synthesize again"
                )
            folders.append(str(Path(str(code.__file__)).parent))
    folders.extend(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)
    if folders:
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(folders))
    return env


def forget_compile_marks() -> list[Path]:
    """Remove this machine's node-cache marks of shared compile archives (``.shared-<key>`` beside
    the compile folders): each names an archive of an S3 that a run's fresh moto does not hold, so
    the run's engines look for, and share, their archives in its own; the compiled files stay."""
    marks = sorted((LOCAL_NODE_CACHE / "compile").glob(f"*/{node_cache_fill.SHARED_MARK.format('*')}"))
    for mark in marks:
        mark.unlink(missing_ok=True)
    return marks


def on_this_machine(value: str) -> str:
    """A path on the node cache's mount (the worker env's compile caches, a weights folder) moved
    to ``LOCAL_NODE_CACHE``; anything else as it is."""
    if value == node_cache.CACHE_PATH or value.startswith(node_cache.CACHE_PATH + "/"):
        return str(LOCAL_NODE_CACHE) + value.removeprefix(node_cache.CACHE_PATH)
    return value


def weights_source(llm: dict[str, Any]) -> str:
    """Where an engine's weights come from: the staged URI the node cache fills from when the engine
    loads a node's copy, else its ``model_source``."""
    callback = llm.get("callback_config")
    return str(callback["callback_kwargs"]["source"]) if callback else str(llm["model_loading_config"]["model_source"])


def local_weights(llm: dict[str, Any], checkpoint: Path, model_source: str | None) -> None:
    """``llm`` loading the checkpoint: with a node cache and a local S3, its folder under
    ``LOCAL_NODE_CACHE``, filled from the local S3 by the deployed callback; else the local S3's
    URI or the checkpoint's directory, no callback."""
    loading = llm["model_loading_config"]
    if llm.get("callback_config") and model_source:
        loading["model_source"] = on_this_machine(loading["model_source"])
        llm["callback_config"]["callback_kwargs"]["source"] = model_source
        return
    llm.pop("callback_config", None)
    loading["model_source"] = model_source or str(checkpoint)


def merged_env(*envs: dict[str, str]) -> dict[str, str]:
    """Later envs win, except PYTHONPATH, whose folders are joined (first ones first)."""
    merged: dict[str, str] = {}
    for env in envs:
        paths = [p for p in (merged.get("PYTHONPATH", ""), env.get("PYTHONPATH", "")) if p]
        merged.update(env)
        if paths:
            merged["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(os.pathsep.join(paths).split(os.pathsep)))
    return merged


def local_profile(deployed: dict[str, Any], checkpoint: Path, model_source: str | None = None) -> dict[str, Any]:
    """The deployed serve config with the documented local substitutions, nothing else:
    ``model_source`` (the staged copy in a local S3, when the deployment loads from S3) or the
    checkpoint's directory (``local_weights``)."""
    local = copy.deepcopy(deployed)
    every_prompt_disaggregated(local)
    for app in local["applications"]:
        for override in app.get("deployments") or []:  # the failover's layout: replicas in overrides
            _one_replica_or_quick_scaling(override)
    for _, llm in serve_config_module.phase_llm_configs(local):
        local_weights(llm, checkpoint, model_source)
        if llm.get("deployment_config"):  # Ray's builder: replicas in the LLMConfig
            _one_replica_or_quick_scaling(llm["deployment_config"])
        # Replicas ask for CPU instead of GPUs; a phase's own Ray resource (per-phase
        # layout) stays, so the pinning to its worker group is rehearsed too.
        bundles = llm.get("placement_group_config", {}).get("bundles", [{}])
        pinning = {k: v for k, v in bundles[0].items() if k not in ("GPU", "CPU")}
        llm["placement_group_config"] = {"bundles": [{"CPU": 1, **pinning}]}
        engine = llm["engine_kwargs"]
        engine["max_model_len"] = LOCAL_MAX_MODEL_LEN
        engine["tensor_parallel_size"] = 1
        kv = engine["kv_transfer_config"]
        kv["kv_buffer_device"] = LOCAL_KV_BUFFER_DEVICE
        kv["kv_connector_extra_config"]["backends"] = [LOCAL_KV_BACKEND]
    return local


def _one_replica_or_quick_scaling(options: dict[str, Any]) -> None:
    """A phase's replica options: autoscaling reacts within ``LOCAL_UPSCALE_DELAY_S``; a fixed count
    (``num_replicas``, or equal bounds) becomes one replica. The ingress's own replicas stay."""
    scaling = options.get("autoscaling_config")
    if options.get("name") == serve_config_module.INGRESS_DEPLOYMENT:
        return
    if scaling and "target_ongoing_requests" in scaling:
        scaling["upscale_delay_s"] = LOCAL_UPSCALE_DELAY_S
    elif scaling:
        scaling.update(min_replicas=1, max_replicas=1, initial_replicas=1)
    elif "num_replicas" in options:
        options["num_replicas"] = 1


def every_prompt_disaggregated(serve_config: dict[str, Any]) -> None:
    """The failover's conditional disaggregation off (``short_prompt_tokens`` 0): the rehearsals'
    prompts are all short, and what they rehearse is the KV moving from prefill to decode."""
    for settings in serve_config_module.failover_settings(serve_config):
        settings["short_prompt_tokens"] = 0


def custom_resources(serve_config: dict[str, Any]) -> dict[str, float]:
    """Ray resources the rehearsed replicas ask for besides CPU: the local node offers them, as
    each phase's worker group does on the cluster."""
    found: dict[str, float] = {}
    llms = [llm for _, llm in serve_config_module.phase_llm_configs(serve_config)]
    for app in serve_config["applications"]:
        llms += (app.get("args") or {}).get("llm_configs", [])
    for llm in llms:
        for bundle in llm.get("placement_group_config", {}).get("bundles", []):
            for name, amount in bundle.items():
                if name not in ("CPU", "GPU"):
                    found[name] = found.get(name, 0) + float(amount)
    return found


# The CPU rehearsal's engines ask for a CPU instead of a GPU.
LOCAL_PLACEMENT = {"bundles": [{"CPU": 1}]}


def colocated_control(
    rehearsed: dict[str, Any], *, replicas: int = 1, placement: dict[str, Any] | None = LOCAL_PLACEMENT
) -> dict[str, Any]:
    """The decode engine's settings without the KV connector, ``replicas`` of it: the baseline
    outputs and the negative control (one replica), or the colocated layout a benchmark compares
    PD with. ``placement`` replaces the engine's placement; None keeps the decode engine's."""
    llm = copy.deepcopy(serve_config_module.llm_config(rehearsed, Phase.DECODE))
    llm["engine_kwargs"].pop("kv_transfer_config")
    llm["deployment_config"] = {"num_replicas": replicas}
    if placement is not None:
        llm["placement_group_config"] = copy.deepcopy(placement)
    return {
        "applications": [
            {
                "name": "colocated",
                "import_path": "ray.serve.llm:build_openai_app",
                "route_prefix": "/",
                "args": {"llm_configs": [llm]},
            }
        ]
    }


def diff(deployed: dict[str, Any], rehearsed: dict[str, Any]) -> str:
    before = yaml.safe_dump(deployed, sort_keys=False).splitlines(keepends=True)
    after = yaml.safe_dump(rehearsed, sort_keys=False).splitlines(keepends=True)
    return "".join(difflib.unified_diff(before, after, "deployed (cdk.out)", "rehearsed (local CPU)"))
