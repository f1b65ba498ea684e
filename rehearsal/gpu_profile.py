"""The GPU rehearsal's local profile, GPU budget emulation and vLLM's profiler figures.

Plain Python (no torch, no vLLM) so that `make test` checks all of it on a CPU machine; what
needs the GPU stack is imported inside functions in rehearsal/gpu.py.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eks_pd_serving.catalog import GPUS, INSTANCE_TYPES, MODELS, ModelFacts, gpu_slug
from eks_pd_serving.k8s import serve_config
from eks_pd_serving.sizing import GIB, MIB, NON_TORCH_BYTES, VLLM_DEFAULT_MAX_NUM_SEQS, Sizing, size

from . import profile

SIDES = ("prefill_config", "decode_config")
# Two engines on one GPU: each takes this share of its memory (vLLM checks free memory at start),
# and this share of the GPU as a Ray resource.
SHARED_GPU_UTILIZATION = 0.4
SHARED_GPU_SHARE = 0.5
# Two engines on one host, each with its own torch.distributed TCPStore. vLLM 0.26's Ray executor
# (v1/executor/ray_executor_v2.py, _select_tcpstore_port) takes the first free port from
# data_parallel_master_port + 100, and without data parallelism that port is VLLM_DP_MASTER_PORT
# (default 0): both engines probe port 100 and the second to listen fails with EADDRINUSE (seen on
# 2026-12-03; Serve restarted it, about 90 s). Each phase gets a window of its own here; on EKS each
# engine has its pod's own network namespace.
TCPSTORE_PORT_BASES = {"prefill_config": 24000, "decode_config": 25000}


@dataclass(frozen=True)
class GpuHost:
    """What the machine running the rehearsal offers."""

    gpus: int
    total_bytes: int  # one GPU's memory as torch reports it (vLLM's base for utilization)
    name: str = ""
    flashinfer: bool = False  # FlashInfer importable: vLLM's SM90 default kernels work
    efa: bool = False  # libfabric and an EFA device: NIXL can use LIBFABRIC as on the cluster

    @property
    def kv_backend(self) -> str:
        return "LIBFABRIC" if self.efa else "UCX"


def detect_host() -> GpuHost:
    """Ask torch (and the kernel, for EFA) what this machine has."""
    import ctypes.util
    import importlib.util

    import torch

    if not torch.cuda.is_available():
        return GpuHost(gpus=0, total_bytes=0)
    _free, total = torch.cuda.mem_get_info(0)
    infiniband = Path("/sys/class/infiniband")
    devices = list(infiniband.iterdir()) if infiniband.is_dir() else []
    efa_devices = [d for d in devices if (d / "device/driver").resolve().name == "efa"]
    return GpuHost(
        gpus=torch.cuda.device_count(),
        total_bytes=int(total),
        name=torch.cuda.get_device_name(0),
        flashinfer=importlib.util.find_spec("flashinfer") is not None,
        efa=bool(efa_devices) and ctypes.util.find_library("fabric") is not None,
    )


def catalog_gpu_bytes(gpu: str) -> int:
    """One GPU's memory as EC2 reports it, for a GPU of the catalog by its name or slug (``L4``,
    ``h200``, ``rtx-pro-server-6000``)."""
    for name, facts in GPUS.items():
        if gpu_slug(name) == gpu_slug(gpu):
            return int(facts.memory_mib * MIB)
    raise ValueError(
        f"--emulate-gpu {gpu!r}: not in the catalog; use one of {', '.join(sorted(gpu_slug(n) for n in GPUS))}"
    )


def emulated_utilization(gpu: str, deployed_utilization: float, host: GpuHost) -> float:
    """The ``gpu_memory_utilization`` that gives an engine on this host the budget it gets on
    ``gpu``: vLLM budgets utilization x torch's total memory (not nvidia-smi's)."""
    budget = deployed_utilization * catalog_gpu_bytes(gpu)
    if budget > host.total_bytes:
        raise ValueError(f"--emulate-gpu {gpu}: its budget ({budget / GIB:.1f} GiB) exceeds this GPU's memory")
    return budget / host.total_bytes


def server_defaults(gpu_bytes: int) -> dict[str, int]:
    """The batch limits vLLM 0.26 picks for an OpenAI server (Ray Serve's engines) by the GPU's
    memory (engine/arg_utils.py): they set the profiling run's activation peak, so an emulated
    GPU must get its own, not the host's (an H200 gets 8,192 tokens; an L4 2,048)."""
    if gpu_bytes >= 70 * GIB:
        return {"max_num_batched_tokens": 8192, "max_num_seqs": 1024}
    return {"max_num_batched_tokens": 2048, "max_num_seqs": 256}


def gpu_profile(
    deployed: dict[str, Any],
    model_dir: Path,
    host: GpuHost,
    *,
    dummy_weights: bool,
    utilization: float | None = None,
    staged_uri: str | None = None,
) -> dict[str, Any]:
    """The deployed serve config with the documented GPU substitutions, nothing else: the local
    model, one replica per phase on one GPU each (a half each when the host has one GPU), NIXL's
    backend for this host, the Triton GDN kernel where FlashInfer is missing, and each engine's
    TCPStore in a port window of its own (``TCPSTORE_PORT_BASES``), every prompt disaggregated
    (``profile.every_prompt_disaggregated``). With ``staged_uri`` the node cache's callback stays and
    fills from there (``warm_node``), as deployed; without it the engines read ``model_dir``."""
    local = copy.deepcopy(deployed)
    profile.every_prompt_disaggregated(local)
    for app in local["applications"]:
        for override in app.get("deployments") or []:  # one replica a phase, even if autoscaled
            if override.get("name") != serve_config.INGRESS_DEPLOYMENT:
                override["autoscaling_config"] = {"min_replicas": 1, "max_replicas": 1, "initial_replicas": 1}
    for phase, llm in serve_config.phase_llm_configs(local):
        side = f"{phase}_config"
        profile.local_weights(llm, model_dir, staged_uri)
        if llm.get("deployment_config"):  # Ray's builder: replicas in the LLMConfig
            llm["deployment_config"].pop("autoscaling_config", None)
            llm["deployment_config"]["num_replicas"] = 1
        engine = llm["engine_kwargs"]
        engine["tensor_parallel_size"] = 1
        if host.gpus < 2:
            bundles = llm.get("placement_group_config", {}).get("bundles", [{}])
            llm["placement_group_config"] = {"bundles": [{**bundles[0], "GPU": SHARED_GPU_SHARE}]}
            engine["gpu_memory_utilization"] = SHARED_GPU_UTILIZATION
        if utilization is not None:
            engine["gpu_memory_utilization"] = utilization
        if dummy_weights:
            engine["load_format"] = "dummy"
        if not host.flashinfer:
            engine["gdn_prefill_backend"] = "triton"
        env_vars = llm.setdefault("runtime_env", {}).setdefault("env_vars", {})
        env_vars["VLLM_DP_MASTER_PORT"] = str(TCPSTORE_PORT_BASES[side])
        kv = engine["kv_transfer_config"]
        kv["kv_buffer_device"] = "cuda"
        kv["kv_connector_extra_config"]["backends"] = [host.kv_backend]
    return local


def first_deploy_steps(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The configs a first deploy goes through: where two engines share one GPU, each engine's
    application alone first, in order, then the whole config; else the whole config at once. Two
    9B engines profiling at once on one GPU each count the other's weights as used, and both failed
    with vLLM's ``No available memory for the cache blocks`` six times (2026-12-06, one H100);
    deployed, each engine has a node of its own."""
    shared = any(
        bundle.get("GPU", 1) < 1
        for _, llm in serve_config.phase_llm_configs(config)
        for bundle in llm.get("placement_group_config", {}).get("bundles", [])
    )
    if not shared:
        return [config]
    engines = [app for app in config["applications"] if _holds_engine(app)]
    return [{**config, "applications": engines[: k + 1]} for k in range(len(engines))] + [config]


def _holds_engine(app: dict[str, Any]) -> bool:
    args = app.get("args") or {}
    return any(isinstance(args.get(k), dict) for k in ("prefill_config", "decode_config", "llm_config"))


def gpu_env(worker_env: dict[str, str], host: GpuHost) -> dict[str, str]:
    """The worker env, plus the sampler switch vLLM needs without FlashInfer, and on one GPU the
    share each engine's Ray worker asks for: vLLM 0.26's RayWorkerProc asks
    ``VLLM_RAY_PER_WORKER_GPUS`` (default 1.0, v1/executor/ray_executor_v2.py), which no half-GPU
    bundle holds (the one-GPU rehearsal failed on it on 2026-11-30)."""
    env = dict(worker_env)
    if not host.flashinfer:
        env["VLLM_USE_FLASHINFER_SAMPLER"] = "0"
    if host.gpus < 2:
        env["VLLM_RAY_PER_WORKER_GPUS"] = str(SHARED_GPU_SHARE)
    return env


# vLLM 0.26.0's profiler lines (v1/worker/gpu_worker.py, v1/core/kv_cache_utils.py).
_FIGURES = {
    "weights_gib": r"Model loading took ([\d.]+) GiB",  # "GiB memory" (model runner v1) or "GiB and" (v2)
    "activation_peak_gib": r"Actual usage is [\d.]+ GiB for weight, ([\d.]+) GiB for peak activation",
    "non_torch_gib": r"GiB for peak activation, ([\d.]+) GiB for non-torch memory",
    "kv_gib": r"Available KV cache memory: ([\d.]+) GiB",
    "kv_tokens": r"GPU KV cache size: ([\d,]+) tokens",
    "concurrency": r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x",
    "block_tokens": r"Setting attention block size to (\d+) tokens",
    "num_blocks": r"Hybrid SSM registration: num_blocks=(\d+)",
    "cudagraph_gib": r"GiB for non-torch memory, and ([\d.]+) GiB for CUDAGraph memory",
    "startup_s": r"STARTUP_S ([\d.]+)",
    "load_s": r"Model loading took [\d.]+ GiB(?: memory)? and ([\d.]+) seconds",
}


def vllm_figures(log: str) -> dict[str, float]:
    """The figures vLLM's profiler printed, by name; a figure it did not print is left out."""
    found = {}
    for name, pattern in _FIGURES.items():
        match = re.search(pattern, log)
        if match:
            found[name] = float(match.group(1).replace(",", ""))
    return found


def decode_figures(log: str) -> dict[str, dict[str, float]]:
    """``gpu_engine --decode``'s lines: batch size -> median tokens/s in all and per stream."""
    return {
        match.group(1): {"tokens_per_s": float(match.group(2)), "per_stream": float(match.group(3))}
        for match in re.finditer(r"DECODE batch=(\d+) tokens_per_s=([\d.]+) per_stream=([\d.]+)", log)
    }


# Where the staging job puts a revision (weights/model_weights.py, weights_prefix):
# s3://<bucket>/models/<model_source>/<revision>. The deployed serve config names that URI.
_STAGED_URI = re.compile(r"^s3://[^/]+/models/(?P<source>.+)/[^/]+$")


def catalogue_source(model_source: str) -> str:
    """The Hugging Face source behind a deployed ``model_source``: the staged URI names it."""
    staged = _STAGED_URI.match(model_source)
    return staged["source"] if staged else model_source


def sizing_for(engine_kwargs: dict[str, Any], model_source: str, gpu: str, model: ModelFacts | None = None) -> Sizing:
    """The synth gate's figures for these engine settings on ``gpu`` (for ``model_source``'s
    catalogue facts, or ``model``'s)."""
    instance = next(f for f in INSTANCE_TYPES.values() if f.gpus and f.gpu_name.lower() == gpu.lower())
    return size(
        model or MODELS[model_source],
        instance,
        dtype=engine_kwargs.get("dtype", "auto"),
        tensor_parallel_size=int(engine_kwargs.get("tensor_parallel_size", 1)),
        gpu_memory_utilization=float(engine_kwargs.get("gpu_memory_utilization", 0.9)),
        max_model_len=int(engine_kwargs["max_model_len"]),
        multimodal=not engine_kwargs.get("language_model_only", False),
        quantization=str(engine_kwargs.get("quantization") or "none"),
        enforce_eager=bool(engine_kwargs.get("enforce_eager", True)),
        # What vLLM profiled with: the engine's own, else its default.
        max_num_seqs=int(engine_kwargs.get("max_num_seqs", VLLM_DEFAULT_MAX_NUM_SEQS)),
    )


def comparison(measured: dict[str, float], sizing: Sizing) -> list[tuple[str, float | None, float, float | None]]:
    """(figure, vLLM, sizing, sizing/vLLM - 1) rows for the figures both give."""
    ours = {
        "weights_gib": sizing.weight_bytes / GIB,
        "activation_peak_gib": sizing.activation_bytes / GIB - NON_TORCH_BYTES / GIB,
        "kv_gib": sizing.kv_budget_bytes / GIB,
        "block_tokens": float(sizing.block_tokens),
        "num_blocks": float(sizing.num_blocks),
        "kv_tokens": float(sizing.kv_capacity_tokens),
        "concurrency": sizing.concurrency,
    }
    rows = []
    for name, value in ours.items():
        theirs = measured.get(name)
        rows.append((name, theirs, value, value / theirs - 1 if theirs else None))
    return rows


def comparison_lines(variant: str, measured: dict[str, float], sizing: Sizing) -> list[str]:
    lines = [f"{variant}: {'figure':<20} {'vLLM':>10} {'sizing':>10} {'diff':>7}"]
    for name, theirs, ours, rel in comparison(measured, sizing):
        shown = "-" if theirs is None else f"{theirs:10.2f}"
        diff = "-" if rel is None else f"{rel:+.1%}"
        lines.append(f"{variant}: {name:<20} {shown:>10} {ours:10.2f} {diff:>7}")
    return lines
