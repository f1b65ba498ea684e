"""The deployed serve application on this machine's NVIDIA GPUs, with the image's Python stack.

    python -m rehearsal.gpu rehearse [--model-shape tiny|full] [--weights DIR]
    python -m rehearsal.gpu emulate --emulate-gpu L4 [--model-shape full]
    python -m rehearsal.gpu bench [--out DIR]

rehearse: the CPU rehearsal's harness (rehearsal/harness.py) with the GPU profile
(rehearsal/gpu_profile.py): KV buffers in CUDA memory, NIXL over UCX (LIBFABRIC where an EFA
device exists), Qwen3.5's own model class. Prefill and decode on different GPUs (sharing one GPU
when there is one). Then the same prompts on one colocated engine with no connector.

emulate: the deployed engine settings, the deployed model's shape with dummy weights (a catalogue
model's own config.json, else the Qwen3.5-9B shape), the memory budget of the named GPU; prints
vLLM's profiler figures beside the sizing gate's, per variant (text only as deployed, and
multimodal), one GPU each.

bench: the 9B shape with dummy weights: PD (prefill GPU + decode GPU) against the same GPUs
serving colocated (two replicas, no connector), under rehearsal/bench.py's workload.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from eks_pd_serving.catalog import CATALOG
from eks_pd_serving.k8s import serve_config as layout
from eks_pd_serving.phase import Phase
from eks_pd_serving.sizing import GIB

from . import bench, catalog_checkpoint, gpu_profile, harness, profile, qwen35_checkpoint
from .harness import log

# The engines' Triton kernels compile on first use; the first start of a 9B engine took ~140 s.
DEPLOY_TIMEOUT_S = 480.0
VARIANTS = {"text-only": True, "multimodal": False}  # language_model_only
# `emulate --engine-choices`: the deployed text-only engine with each weight format and graph
# mode (the settings quantization and {phase}_enforce_eager), batch limits pinned.
ENGINE_CHOICES: dict[str, dict[str, Any]] = {
    "bf16-eager": {"enforce_eager": True},
    "fp8-eager": {"enforce_eager": True, "quantization": "fp8"},
    "bf16-graphs": {"enforce_eager": False},
    "fp8-graphs": {"enforce_eager": False, "quantization": "fp8"},
    # How the weights load (a written checkpoint, --model-shape full-weights): vLLM's default
    # safetensors loader against the Run:ai streamer.
    "bf16-eager-runai": {"enforce_eager": True, "load_format": "runai_streamer"},
}
# A few requests of each kind before measuring (first calls compile kernels).
WARM_UP = bench.Workload(window_s=3, streams=2, long_prompts=1, first_long_at_s=0.5)


def _model(args: argparse.Namespace, work: Path, model_source: str = "") -> tuple[Path, bool]:
    """(model directory, dummy weights?): the given weights, else a catalogue model's shape from its
    config.json, else a Qwen3.5 shape."""
    if args.weights:
        return args.weights.resolve(), False
    if model_source in CATALOG:
        return catalog_checkpoint.build((work / model_source.replace("/", "--")).resolve(), model_source), True
    directory = qwen35_checkpoint.build((work / f"qwen3.5-{args.model_shape}").resolve(), args.model_shape)
    return directory, args.model_shape == "full"  # tiny and full-weights carry their weights


def _deployed(template: Path) -> tuple[dict[str, Any], dict[str, Any], str]:
    ray_service = profile.ray_service_from_template(template)
    deployed = profile.serve_config(ray_service)
    return ray_service, deployed, layout.llm_config(deployed, Phase.DECODE)["model_loading_config"]["model_id"]


def rehearse(args: argparse.Namespace, host: gpu_profile.GpuHost, started: float) -> int:
    ray_service, deployed, model_id = _deployed(args.template)
    model_dir, dummy = _model(args, args.work_dir)
    rehearsed = gpu_profile.gpu_profile(deployed, model_dir, host, dummy_weights=dummy)
    log("== deployed vs rehearsed serve config")
    log(profile.diff(deployed, rehearsed) or "(identical)")
    env = gpu_profile.gpu_env(profile.worker_env(ray_service), host)
    log(f"== worker env: {json.dumps(env, sort_keys=True)}")
    if host.gpus < 2:
        log(f"== one GPU: prefill and decode share it, {gpu_profile.SHARED_GPU_UTILIZATION} of its memory each")
    report: dict[str, Any] = {"host": vars(host), "deployed": deployed, "rehearsed": rehearsed, "env": env}
    control = profile.colocated_control(rehearsed, placement=None)
    run = harness.Rehearsal(rehearsed, env, model_id, args.timeout_s, started, control=control)
    return harness.rehearse_and_judge(report, run, args.report, strict=False)


def emulate(args: argparse.Namespace, host: gpu_profile.GpuHost) -> int:
    ray_service, deployed, _ = _deployed(args.template)
    prefill = layout.llm_config(deployed, Phase.PREFILL)
    model_source = gpu_profile.catalogue_source(profile.weights_source(prefill))
    deployed_engine = prefill["engine_kwargs"]
    model_dir, dummy = _model(args, args.work_dir, model_source)
    utilization = gpu_profile.emulated_utilization(args.emulate_gpu, deployed_engine["gpu_memory_utilization"], host)
    log(f"== {args.emulate_gpu} budget on {host.name}: gpu_memory_utilization {utilization:.6f} of "
        f"{host.total_bytes / GIB:.2f} GiB (torch's total)")  # fmt: skip
    env = {**os.environ, **gpu_profile.gpu_env(profile.worker_env(ray_service), host), "VLLM_LOGGING_LEVEL": "DEBUG"}
    env.pop("VLLM_HOST_IP", None)
    procs = {}
    variants: dict[str, dict[str, Any]] = {v: {"language_model_only": t} for v, t in VARIANTS.items()}
    if args.engine_choices:
        variants = {c: {"language_model_only": True, **ENGINE_CHOICES[c]} for c in args.engine_choices}
    for index, (variant, choice) in enumerate(variants.items()):
        kwargs = copy.deepcopy(deployed_engine)
        kwargs.update(model=str(model_dir), gpu_memory_utilization=utilization, **choice)
        for name, value in gpu_profile.server_defaults(gpu_profile.catalog_gpu_bytes(args.emulate_gpu)).items():
            kwargs.setdefault(name, value)
        if args.max_num_seqs:
            kwargs["max_num_seqs"] = args.max_num_seqs
        kwargs["kv_transfer_config"]["kv_connector_extra_config"]["backends"] = [host.kv_backend]
        kwargs["kv_transfer_config"]["kv_port"] = 14579 + index
        if dummy:
            kwargs["load_format"] = "dummy"
        if not host.flashinfer:
            kwargs["gdn_prefill_backend"] = "triton"
        log(f"== {variant}: {json.dumps(kwargs, sort_keys=True)}")
        logfile = (args.work_dir / f"emulate-{variant}.log").open("w")
        # One GPU and one NIXL side-channel port per engine (two may run at once).
        child_env = {**env, "CUDA_VISIBLE_DEVICES": str(index % max(host.gpus, 1)),
                     "VLLM_NIXL_SIDE_CHANNEL_PORT": str(5600 + 10 * index)}  # fmt: skip
        cmd = [sys.executable, "-m", "rehearsal.gpu_engine", json.dumps(kwargs), *(["--decode"] if args.decode else [])]
        procs[variant] = (subprocess.Popen(cmd, env=child_env, stdout=logfile, stderr=subprocess.STDOUT), kwargs)
        if host.gpus < 2:
            procs[variant][0].wait()
    report: dict[str, Any] = {"gpu": args.emulate_gpu, "host": vars(host), "utilization": utilization}
    ok = True
    for variant, (proc, kwargs) in procs.items():
        rc = proc.wait(timeout=args.timeout_s)
        text = (args.work_dir / f"emulate-{variant}.log").read_text()
        measured = gpu_profile.vllm_figures(text)
        sizing = gpu_profile.sizing_for({**kwargs, "gpu_memory_utilization": deployed_engine["gpu_memory_utilization"]},
                                        model_source, args.emulate_gpu)  # fmt: skip
        report[variant] = {"rc": rc, "vllm": measured, "rows": gpu_profile.comparison(measured, sizing),
                           "engine": kwargs, "decode": gpu_profile.decode_figures(text)}  # fmt: skip
        log(f"== {variant}: engine exit {rc}")
        for line in gpu_profile.comparison_lines(variant, measured, sizing):
            log(line)
        ok = ok and rc == 0 and "kv_gib" in measured
        if rc:
            log("\n".join(text.splitlines()[-25:]))
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(json.dumps(report, indent=2))
    return 0 if ok else 1


def run_bench(args: argparse.Namespace, host: gpu_profile.GpuHost, started: float) -> int:
    from transformers import AutoTokenizer

    ray_service, deployed, model_id = _deployed(args.template)
    model_dir, dummy = _model(args, args.work_dir)
    pd = gpu_profile.gpu_profile(deployed, model_dir, host, dummy_weights=dummy)
    layouts = {"pd": pd, "colocated": profile.colocated_control(pd, replicas=max(1, min(2, host.gpus)), placement=None)}
    env = gpu_profile.gpu_env(profile.worker_env(ray_service), host)
    workload = bench.Workload(window_s=args.window_s, streams=args.streams, long_prompts=args.long_prompts)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    log(f"== workload: {workload}")
    log(profile.diff(deployed, pd))
    http_port, metrics_port = harness.free_port(), harness.free_port()
    args.out.mkdir(parents=True, exist_ok=True)
    results = {}
    with harness.local_ray(env, metrics_port, profile.custom_resources(pd)):
        for name in args.layouts:
            config = layouts[name]
            log(f"== {name}: deploying")
            ready_s = harness.deploy(harness.build(config), http_port, args.timeout_s)
            log(f"== {name}: healthy after {ready_s:.1f} s ({time.monotonic() - started:.1f} s since start)")
            base = f"http://127.0.0.1:{http_port}"
            records = asyncio.run(bench.run(base, model_id, tokenizer, WARM_UP))
            log(f"== {name}: warm-up {len(records)} requests, failed {sum(bool(r.error) for r in records)}")
            records = asyncio.run(bench.run(base, model_id, tokenizer, workload))
            bench.save(
                args.out / f"bench-{name}.json", name, workload, records, {"host": vars(host), "ready_s": ready_s}
            )
            results[name] = bench.summary(records)
            log(f"== {name}: {json.dumps(results[name])}")
            harness.undeploy(config)
    log(bench.table(results))
    try:
        runs = [bench.load(args.out / f"bench-{name}.json")[:3] for name in results]
        bench.plot(runs, args.out / "bench.png")
        log(f"picture: {args.out / 'bench.png'}")
    except ImportError:
        log(f"no matplotlib here: python -m rehearsal.bench {args.out}/bench-*.json --png bench.png draws it")
    log(f"total {time.monotonic() - started:.1f} s; runs in {args.out}")
    return 0 if all(not s["failed"] for s in results.values()) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("rehearse", "emulate", "bench"))
    parser.add_argument("--template", type=Path, default=Path("cdk.out/RayLlmPdServing.template.json"))
    parser.add_argument("--work-dir", type=Path, default=Path(".rehearsal/gpu"))
    parser.add_argument("--model-shape", choices=qwen35_checkpoint.SHAPES)
    parser.add_argument("--weights", type=Path, help="a real checkpoint directory instead of a built one")
    parser.add_argument("--emulate-gpu", default="L4", help="emulate: a catalog GPU (L4, rtx-pro-server-6000)")
    parser.add_argument("--report", type=Path)
    parser.add_argument("--out", type=Path, help="bench: where the runs' JSON goes")
    parser.add_argument("--layouts", nargs="+", default=["pd", "colocated"], choices=("pd", "colocated"))
    parser.add_argument("--window-s", type=float, default=40.0)
    parser.add_argument("--streams", type=int, default=24)
    parser.add_argument("--long-prompts", type=int, default=12)
    parser.add_argument("--timeout-s", type=float, default=DEPLOY_TIMEOUT_S)
    parser.add_argument("--engine-choices", nargs="+", choices=tuple(ENGINE_CHOICES),
                        help="emulate: these weight-format and graph-mode choices (text only) instead")  # fmt: skip
    parser.add_argument("--max-num-seqs", type=int, help="emulate: pin max_num_seqs (default: vLLM's)")
    parser.add_argument("--decode", action="store_true", help="emulate: also time decode at batch 1 and full")
    args = parser.parse_args(argv)
    args.model_shape = args.model_shape or ("tiny" if args.command == "rehearse" else "full")
    args.report = args.report or args.work_dir / f"{args.command}.json"
    args.out = args.out or args.work_dir
    args.work_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    host = gpu_profile.detect_host()
    if host.gpus == 0:
        log("the GPU rehearsal needs an NVIDIA GPU that torch can see (none here); `make rehearse` runs on CPU")
        return 2
    log(f"== host: {host}")
    if args.command == "emulate":
        try:
            gpu_profile.emulated_utilization(args.emulate_gpu, 0.9, host)
        except ValueError as error:  # not in the catalog, or larger than this GPU
            log(str(error))
            return 2
        return emulate(args, host)
    return rehearse(args, host, started) if args.command == "rehearse" else run_bench(args, host, started)


if __name__ == "__main__":
    sys.exit(main())
