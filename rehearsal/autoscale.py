"""Autoscaling rehearsed on this CPU: the synthesized autoscaled serve application, bursts of
concurrent streams until Serve adds a decode replica, and every request's KV still loaded from
prefill over NIXL, the added replica's included.

    .venv-rehearse/bin/python -m rehearsal.autoscale --template <template synthesized with -c autoscaling=true>

The template's Serve autoscaling config is kept (bounds, target); the one local change is a
2-second upscale delay (deployed: 30 s), printed in the diff. Replica counts are Serve's own
(``serve.status()``); KV counters are the engines' own, from Ray's metrics endpoint. Bounded by
--timeout-s; everything it started is stopped on success, failure and Ctrl-C. Exit 0 only on PASS.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from . import profile, tiny_checkpoint
from .probes import Endpoint, ProbeFailed, external_kv_by_replica, settled_counters, stream_chat
from .run import LOCAL_ENV, deploy, free_port, local_ray, log, recorded

BURST = 6
MAX_TOKENS = 96
PROMPTS = [f"Request {i}: describe how decode pulls the prompt's KV blocks from prefill" for i in range(BURST)]


def decode_deployment(serve_config: dict[str, Any]) -> dict[str, Any]:
    (app,) = serve_config["applications"]
    return dict(app["args"]["decode_config"]["deployment_config"])


def decode_replicas() -> dict[str, int]:
    """Serve's own count of the decode deployment's replicas, by state."""
    from ray import serve

    for app in serve.status().applications.values():
        for name, deployment in app.deployments.items():
            if name.startswith("Decode:"):
                return {str(state): int(n) for state, n in deployment.replica_states.items()}
    raise ProbeFailed("no Decode: deployment in serve.status()")


def running(states: dict[str, int]) -> int:
    return states.get("RUNNING", 0) + states.get("ReplicaState.RUNNING", 0)


def burst(endpoint: Endpoint) -> list[dict[str, Any]]:
    """``BURST`` streams at once; each returns what the client saw."""
    with httpx.Client(base_url=endpoint.base_url, timeout=300) as client, ThreadPoolExecutor(BURST) as pool:
        return list(pool.map(lambda prompt: stream_chat(client, endpoint, prompt, MAX_TOKENS), PROMPTS))


def rehearse(rehearsed: dict[str, Any], env: dict[str, str], model_id: str, timeout_s: float) -> dict[str, Any]:
    """Bursts until Serve decides on a second decode replica; then no load until it runs (on two
    cores, load would only slow its start); then one burst served by both."""
    started = time.monotonic()
    http_port, metrics_port = free_port(), free_port()
    endpoint = Endpoint(f"http://127.0.0.1:{http_port}", model_id, f"http://127.0.0.1:{metrics_port}/metrics")
    report: dict[str, Any] = {"timeline": [], "bursts": []}

    def observe() -> dict[str, int]:
        states = decode_replicas()
        report["timeline"].append((round(time.monotonic() - started, 1), states))
        if time.monotonic() - started > timeout_s:
            raise ProbeFailed(f"no second running decode replica within {timeout_s:.0f} s: {states}")
        return states

    def send(label: str) -> None:
        sent = time.monotonic() - started
        with ThreadPoolExecutor(1) as pool:
            future = pool.submit(burst, endpoint)
            while not future.done():
                observe()
                time.sleep(1.0)
        report["bursts"].append({"phase": label, "sent_s": round(sent, 1), "requests": future.result()})
        log(f"== {label} burst {len(report['bursts'])}: {BURST} streams done; decode replicas {observe()}")

    with local_ray(env, metrics_port, profile.custom_resources(rehearsed)):
        report["ready_s"] = deploy(rehearsed, http_port, timeout_s)
        report["replicas_before"] = decode_replicas()
        log(f"== healthy after {report['ready_s']:.1f} s; decode replicas {report['replicas_before']}")
        before = settled_counters(endpoint.metrics_url)
        while sum(observe().values()) < 2:
            send("load")
        report["decided_s"] = report["timeline"][-1][0]
        log(f"== Serve added a decode replica at {report['decided_s']:.1f} s: {decode_replicas()}")
        while running(observe()) < 2:
            time.sleep(1.0)
        report["scaled_up_s"] = report["timeline"][-1][0]
        log(f"== two decode replicas running at {report['scaled_up_s']:.1f} s")
        by_replica_before = external_kv_by_replica(endpoint.metrics_url)
        report["replicas_with_kv_before_scale_up"] = sorted(k for k, v in by_replica_before.items() if v > 0)
        send("scaled")
        after = settled_counters(endpoint.metrics_url)
        by_replica_after = external_kv_by_replica(endpoint.metrics_url)
        report["replicas_after"] = observe()
    report["engine"] = {k: after[k] - before[k] for k in after}
    report["external_kv_by_replica"] = {
        replica: value - by_replica_before.get(replica, 0.0) for replica, value in by_replica_after.items()
    }
    return report


def judge(report: dict[str, Any], scaling: dict[str, Any]) -> tuple[bool, list[str]]:
    requests = [r for b in report["bursts"] for r in b["requests"]]
    expected = sum(r["prompt_tokens"] - 1 for r in requests)
    moved = report["engine"]["external_kv_tokens"]
    earlier = set(report["replicas_with_kv_before_scale_up"])
    added = {k: v for k, v in report["external_kv_by_replica"].items() if v > 0 and k not in earlier}
    bounds = (
        f"min {scaling['min_replicas']}, max {scaling['max_replicas']}, target {scaling['target_ongoing_requests']}"
    )
    checks = [
        (
            f"decode scaled from {running(report['replicas_before'])} to 2 replicas (Serve's status; {bounds})",
            running(report["replicas_before"]) == scaling["min_replicas"] and running(report["replicas_after"]) == 2,
        ),
        (
            f"{len(requests)} streams in {len(report['bursts'])} bursts completed, "
            f"{sum(r['completion_tokens'] for r in requests)} tokens",
            all(r["completion_tokens"] >= 1 for r in requests),
        ),
        (
            f"decode loaded {moved:.0f} prompt tokens from prefill; all but the last of every prompt: {expected}",
            moved == expected and report["engine"]["nixl_transfers"] >= len(requests),
        ),
        (
            "the added decode replica loaded KV over NIXL: "
            + (", ".join(f"{k}: {v:.0f} prompt tokens" for k, v in sorted(added.items())) or "none"),
            bool(added),
        ),
    ]
    lines = [f"{'PASS' if ok else 'FAIL'}: {text}" for text, ok in checks]
    return all(ok for _, ok in checks), lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--template", type=Path, required=True)
    parser.add_argument("--checkpoint", type=Path, default=Path(".rehearsal/tiny-checkpoint"))
    parser.add_argument("--report", type=Path, default=Path(".rehearsal/autoscale-report.json"))
    parser.add_argument("--timeout-s", type=float, default=480.0)
    args = parser.parse_args(argv)
    started = time.monotonic()
    ray_service = profile.ray_service_from_template(args.template)
    deployed = profile.serve_config(ray_service)
    scaling = decode_deployment(deployed).get("autoscaling_config")
    if not scaling or scaling["max_replicas"] < 2:
        print(
            f"error: {args.template} has no decode autoscaling up to 2 replicas. Fix: synthesize with "
            "-c autoscaling=true -c decode_max_replicas=2",
            file=sys.stderr,
        )
        return 2
    checkpoint = tiny_checkpoint.build(args.checkpoint.resolve())
    rehearsed = profile.local_profile(deployed, checkpoint)
    log("== deployed vs rehearsed serve config")
    log(profile.diff(deployed, rehearsed) or "(identical)")
    env = {**profile.worker_env(ray_service), **LOCAL_ENV}
    model_id = deployed["applications"][0]["args"]["decode_config"]["model_loading_config"]["model_id"]
    report: dict[str, Any] = {"deployed": deployed, "rehearsed": rehearsed}
    failed = recorded(
        report, args.report, lambda: rehearse(rehearsed, env, model_id, args.timeout_s), "AUTOSCALING REHEARSAL"
    )
    if failed is not None:
        return failed
    ok, lines = judge(report, scaling)
    for line in lines:
        log(line)
    log(f"total {time.monotonic() - started:.1f} s; report in {args.report}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
