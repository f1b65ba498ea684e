"""The Ray side of a run, in a process of its own (its own session): a dead GCS without a store
takes every Ray process with it, so the parent judges from the events file, however this ended.
The engines (CPU, or the image's stack on GPUs), each chosen fault's setup, the deploy, the right
answers, then the faults in the registry's order under the clients' load."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from eks_pd_serving.k8s import serve_config as layout
from eks_pd_serving.phase import Phase

from .. import gpu_profile, profile, qwen35_checkpoint, tiny_checkpoint, warm_node
from ..harness import LOCAL_ENV, PROMPTS, build, deploy, free_port, local_ray, logs_dir, undeploy
from ..probes import Endpoint
from . import registry
from .fault import Context, RunArgs
from .kv import KV_UCX_ENV
from .load import Events, Load, Outcome, answers, texts_under_load
from .update import deploy_config

# On a GPU every fault's KV goes over TCP: the two engines share one GPU here, where UCX would take
# CUDA IPC, which no two nodes have (deployed, KV crosses EFA). KV stays in CUDA memory as deployed;
# UCX copies it through host memory onto TCP. (Host staging, kv_buffer_device cpu, fails for hybrid
# models in vLLM 0.26: initialize_host_xfer_buffer takes every KV cache for one tensor.)
GPU_KV_ENV = {**KV_UCX_ENV, "UCX_TLS": "tcp,cuda_copy"}


def _engines(run: RunArgs, ray_service: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str], Path | None]:
    """The serve config as rehearsed here, the Ray processes' environment and the checkpoint a warm
    node holds (None: the engines read a local checkpoint): on this CPU the tiny checkpoint, through
    the node cache as deployed when the deployed config has it; on NVIDIA GPUs the image's stack
    with Qwen3.5's own class and the GPU profile (``--weights``: the real size, through the node
    cache)."""
    deployed = profile.serve_config(ray_service)
    if not run.gpu:
        tiny = tiny_checkpoint.build(run.checkpoint.resolve())
        cached = layout.llm_config(deployed, Phase.DECODE).get("callback_config") is not None
        rehearsed = profile.local_profile(deployed, tiny, warm_node.staged_uri(deployed) if cached else None)
        return rehearsed, {**profile.worker_env(ray_service), **LOCAL_ENV}, tiny if cached else None
    host = gpu_profile.detect_host()
    env = gpu_profile.gpu_env(profile.worker_env(ray_service), host)
    if run.weights:  # the real size, through the node cache as deployed (warm_node seeds it)
        rehearsed = gpu_profile.gpu_profile(deployed, Path(run.weights), host, dummy_weights=False,
                                            staged_uri=warm_node.staged_uri(deployed))  # fmt: skip
        return rehearsed, env, Path(run.weights)
    model_dir = qwen35_checkpoint.build((run.checkpoint.parent / "qwen3.5-tiny").resolve(), "tiny")
    return gpu_profile.gpu_profile(deployed, model_dir, host, dummy_weights=False), env, None


def run_child(run: RunArgs) -> int:
    events = Events(run.events)
    ray_service = profile.ray_service_from_template(run.template)
    rehearsed, env, warm = _engines(run, ray_service)
    faults = registry.chosen(run.faults)
    model_id = layout.llm_config(rehearsed, Phase.DECODE)["model_loading_config"]["model_id"]
    for name in [k for k in env if k.startswith(("EKS_PD_API_KEYS", "RAY_SERVE_HTTP_PROXY"))]:
        env.pop(name)  # the key check is the main rehearsal's; here every request goes unkeyed
    # Serve's replica lines on stderr too (its log files buffer them): the parent counts the KV
    # guard's from the child's output, as a pod's log would show them.
    env["RAY_SERVE_LOG_TO_STDERR"] = "1"
    for fault in faults:
        env.update(fault.engine_env())
    if run.gpu:
        env.update(GPU_KV_ENV)
    http_port, metrics_port = free_port(), free_port()
    endpoint = Endpoint(f"http://127.0.0.1:{http_port}", model_id, f"http://127.0.0.1:{metrics_port}/metrics")
    with contextlib.ExitStack() as stack:
        if warm is not None:
            env.update(stack.enter_context(warm_node.warm_node(warm, rehearsed, free_port())))
        setups = {f.key: f.setup(stack, ray_service, run) for f in faults}
        password = next((s.redis_password for s in setups.values() if s.redis_password), None)
        events.write({"type": "gcs_store", "on": password is not None})
        for setup in setups.values():
            env.update(setup.env)
        resources = profile.custom_resources(rehearsed)
        run_id = stack.enter_context(local_ray(env, metrics_port, resources, redis_password=password))
        events.write({"type": "ray_logs", "dir": str(logs_dir())})
        _expected(run, events, rehearsed, endpoint, http_port, any(f.deploys_as_kuberay for f in faults))
        with Load(endpoint, events, run.streams) as load:
            context = Context(run, load, events, endpoint, http_port, run_id, rehearsed,
                              {key: s.state for key, s in setups.items()})  # fmt: skip
            for fault in faults:
                fault.run(context)
    return 0


def _expected(run: RunArgs, events: Events, rehearsed: dict[str, Any], endpoint: Endpoint, http_port: int,
              as_kuberay: bool) -> None:  # fmt: skip
    """The colocated control's answers (the reference), then the PD app deployed and its own
    answers before any fault: the right texts, and their tokens, go to the events."""
    reference: dict[str, Outcome] = {}
    under_load: dict[str, list[Outcome]] | None = None
    if not run.no_control:
        control = profile.colocated_control(rehearsed, placement=None if run.gpu else profile.LOCAL_PLACEMENT)
        deploy(build(control), http_port, run.timeout_s)
        reference = answers(endpoint, "the colocated control")
        if run.control_load_s > 0:
            under_load = texts_under_load(endpoint, events, run.streams, run.control_load_s)
        undeploy(control)
    # An update redeploys the config as KubeRay does, so the first deploy goes that way too.
    # On one shared GPU the engines start one after the other (gpu_profile.first_deploy_steps).
    ready_s = 0.0
    for step in gpu_profile.first_deploy_steps(rehearsed) if run.gpu else [rehearsed]:
        if as_kuberay:
            ready_s += deploy_config(step, http_port, run.timeout_s)
        else:
            ready_s += deploy(build(step), http_port, run.timeout_s)
    events.write({"type": "ready", "ready_s": ready_s})
    kv = layout.llm_config(rehearsed, Phase.DECODE)["engine_kwargs"]["kv_transfer_config"]
    own = answers(endpoint, "the PD app")
    # Without the control, the PD app's own answers are the only right ones (a guarded decode
    # never recomputes: it refuses).
    right = {p: [own[p], *([reference[p]] if reference else []), *(under_load or {}).get(p, [])] for p in PROMPTS}
    events.write({"type": "expected", "control": {p: (reference or own)[p].text for p in PROMPTS},
                  "pd": {p: own[p].text for p in PROMPTS},
                  "control_under_load": under_load and {p: [o.text for o in os] for p, os in under_load.items()},
                  "reference_tokens": {p: [o.tokens for o in outcomes if o.tokens] for p, outcomes in right.items()},
                  "kv_load_failure_policy": kv.get("kv_load_failure_policy", "fail"),
                  "failover": next(iter(layout.failover_settings(rehearsed)), None)})  # fmt: skip
