"""What the API key check adds to a request's latency, on this machine: the deployed check in
front of one engine (the rehearsal's colocated control app, built from the template), then the
same app with no check, then the check again, each in a fresh local Ray; in each, the median of
``--requests`` timed ``GET /v1/models`` (the proxy and ingress path, no engine work) and of
``--chats`` one-token chat completions, after a warm-up.

    .venv-rehearse/bin/python -m rehearsal.api_keys_bench --template <internal or api_keys=true template>

Prints one JSON object; nothing is asserted (a figure, not a test)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from eks_pd_serving.endpoint import proxy

from . import api_keys, profile, tiny_checkpoint
from .harness import LOCAL_ENV, build, deploy, free_port, local_ray, undeploy

_HOOK_ENV = (proxy.CALLBACK_ENV, proxy.SECRET_ENV, proxy.REFRESH_ENV, "PYTHONPATH")


def _timed(client: httpx.Client, method: str, path: str, count: int, body: Any = None) -> list[float]:
    seconds = []
    for _ in range(count):
        started = time.perf_counter()
        response = client.request(method, path, json=body)
        seconds.append(time.perf_counter() - started)
        if response.status_code != 200:
            raise RuntimeError(f"{method} {path}: HTTP {response.status_code}")
    return seconds


def _session(control: dict[str, Any], env: dict[str, str], key: str | None, args: argparse.Namespace) -> dict[str, Any]:
    for name in _HOOK_ENV:  # a previous session's hook must not leak into this one
        os.environ.pop(name, None)
    http_port, metrics_port = free_port(), free_port()
    with local_ray(env, metrics_port, profile.custom_resources(control)):
        deploy(build(control), http_port, args.timeout_s)
        (app,) = control["applications"]
        model = (
            app["args"]["llm_configs"][0]["model_loading_config"]["model_id"] if "llm_configs" in app["args"] else None
        )
        headers = {"Authorization": f"Bearer {key}"} if key else None
        with httpx.Client(base_url=f"http://127.0.0.1:{http_port}", headers=headers, timeout=120) as client:
            model = model or client.get("/v1/models").json()["data"][0]["id"]
            chat = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "temperature": 0}
            _timed(client, "GET", "/v1/models", 20)  # warm-up
            _timed(client, "POST", "/v1/chat/completions", 3, chat)
            models = _timed(client, "GET", "/v1/models", args.requests)
            chats = _timed(client, "POST", "/v1/chat/completions", args.chats, chat)
        undeploy(control)
    return {
        "models_median_ms": statistics.median(models) * 1000,
        "chat_median_ms": statistics.median(chats) * 1000,
        "models_n": len(models),
        "chat_n": len(chats),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--template", type=Path, required=True)
    parser.add_argument("--checkpoint", type=Path, default=Path(".rehearsal/tiny-checkpoint"))
    parser.add_argument("--work", type=Path, default=Path(".rehearsal/api-keys-bench"))
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--chats", type=int, default=60)
    parser.add_argument("--timeout-s", type=float, default=240.0)
    args = parser.parse_args(argv)
    for noisy in ("httpx", "ray", "ray.serve", "vllm"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    ray_service = profile.ray_service_from_template(args.template)
    checkpoint = tiny_checkpoint.build(args.checkpoint.resolve())
    deployed = profile.serve_config(ray_service)
    control = profile.colocated_control(profile.local_profile(deployed, checkpoint))
    env = {**profile.worker_env(ray_service), **LOCAL_ENV}
    for name in _HOOK_ENV:
        env.pop(name, None)
    results: dict[str, Any] = {}
    with api_keys.local_keys(args.template, args.work.resolve(), free_port()) as keys:
        if keys is None:
            print(f"{args.template} has no API key check (synthesize with api_keys=true)")
            return 1
        for name, keyed in (("checked", True), ("unchecked", False), ("checked_again", True)):
            results[name] = _session(
                control, profile.merged_env(env, keys.env if keyed else {}), keys.key if keyed else None, args
            )
    checked = [results["checked"], results["checked_again"]]
    for figure in ("models_median_ms", "chat_median_ms"):
        results[f"added_{figure}"] = statistics.mean(r[figure] for r in checked) - results["unchecked"][figure]
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
