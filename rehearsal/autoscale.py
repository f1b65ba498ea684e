"""The scale-up part of the CPU rehearsal, run when the rehearsed template autoscales decode up to
two replicas or more (``rehearsal.run`` calls it while the PD application is deployed).

Bursts of concurrent streams until Serve adds a decode replica, no load until it runs (on two
cores load would only slow its start), then one more burst: Serve's own status gives the replica
counts; the engines' counters (by Ray's ``ReplicaId`` label) show every request's KV loaded from
prefill over NIXL, the added replica's included. The template's autoscaling config is kept; the
local profile only shortens ``upscale_delay_s`` (printed in the diff).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from eks_pd_serving.k8s import serve_config as layout
from eks_pd_serving.phase import Phase

from .probes import Endpoint, ProbeFailed, external_kv_by_replica, settled_counters, stream_chat

BURST = 6
MAX_TOKENS = 96
PROMPTS = [f"Request {i}: describe how decode pulls the prompt's KV blocks from prefill" for i in range(BURST)]


def decode_scaling(serve_config: dict[str, Any]) -> dict[str, Any] | None:
    """The decode deployment's autoscaling config when it can reach two replicas, else None."""
    scaling = layout.replica_options(serve_config, Phase.DECODE).get("autoscaling_config")
    return dict(scaling) if scaling and scaling["max_replicas"] >= 2 else None


def decode_replicas() -> dict[str, int]:
    """Serve's own count of the decode deployment's replicas, by state."""
    from ray import serve

    for app in serve.status().applications.values():
        for name, deployment in app.deployments.items():
            if name.startswith("Decode:"):
                return {str(state): int(n) for state, n in deployment.replica_states.items()}
    raise ProbeFailed("no Decode: deployment in serve.status()")


def running(states: dict[str, int]) -> int:
    return states.get("RUNNING", 0)


def burst(endpoint: Endpoint) -> list[dict[str, Any]]:
    """``BURST`` streams at once; each returns what the client saw."""
    with endpoint.client(300) as client, ThreadPoolExecutor(BURST) as pool:
        return list(pool.map(lambda prompt: stream_chat(client, endpoint, prompt, MAX_TOKENS), PROMPTS))


def scale_up(endpoint: Endpoint, timeout_s: float, log: Any = print) -> dict[str, Any]:
    """Against the deployed PD application: bursts until a second decode replica runs, then one
    burst served with it. Raises ProbeFailed after ``timeout_s``."""
    started = time.monotonic()
    report: dict[str, Any] = {"timeline": [], "bursts": [], "replicas_before": decode_replicas()}

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

    before = settled_counters(endpoint.metrics_url)
    while sum(observe().values()) < 2:
        send("load")
    report["decided_s"] = report["timeline"][-1][0]
    log(f"== Serve added a decode replica {report['decided_s']:.1f} s into the bursts: {decode_replicas()}")
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
    return all(ok for _, ok in checks), [f"{'PASS' if ok else 'FAIL'}: {text}" for text, ok in checks]
