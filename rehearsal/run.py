"""Run the deployed serve application on this machine's CPU and probe it as a client would.

    .venv-rehearse/bin/python -m rehearsal.run --template cdk.out/RayLlmPdServing.template.json

Starts Ray and Serve on loopback, deploys the rehearsed config (see rehearsal/profile.py), waits
for it to be healthy (bounded), probes the OpenAI endpoint, reads the decode engine's
KV-transfer counters; when the template autoscales decode, drives a scale-up and checks the added
replica (rehearsal/autoscale.py); then repeats the same prompts on one colocated engine with no
connector (the baseline for outputs and the negative control for the counters). Everything it
started is stopped on success, failure and Ctrl-C. Exit 0 only when every check passed.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from eks_pd_serving.k8s import serve_config as layout
from eks_pd_serving.phase import Phase

from . import api_keys, profile, s3_weights, tiny_checkpoint
from .harness import LOCAL_ENV, Rehearsal, free_port, log, rehearse_and_judge


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--template", type=Path, default=Path("cdk.out/RayLlmPdServing.template.json"))
    parser.add_argument("--checkpoint", type=Path, default=Path(".rehearsal/tiny-checkpoint"))
    parser.add_argument("--report", type=Path, default=Path(".rehearsal/report.json"))
    parser.add_argument("--timeout-s", type=float, default=240.0)
    parser.add_argument(
        "--serve-config", type=Path, help="run this serve config YAML instead (to show a broken one fail)"
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    for noisy in ("httpx", "ray", "ray.serve", "vllm"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    ray_service = profile.ray_service_from_template(args.template)
    deployed = profile.serve_config(ray_service)
    checkpoint = tiny_checkpoint.build(args.checkpoint.resolve())
    source = profile.weights_source(layout.llm_config(deployed, Phase.DECODE))
    work = args.report.parent.resolve()
    # With api_keys: the check's code from the template, the keys in a local Secrets Manager.
    with api_keys.local_keys(args.template, work, free_port()) as keys:
        if not source.startswith("s3://"):
            return _rehearse(args, ray_service, deployed, checkpoint, None, started, keys)
        # weights_source=s3: the checkpoint staged where the serve config points, in a local S3.
        with s3_weights.staged(checkpoint, source, work, free_port()) as weights:
            return _rehearse(args, ray_service, deployed, checkpoint, weights, started, keys)


def _rehearse(
    args: argparse.Namespace,
    ray_service: dict[str, Any],
    deployed: dict[str, Any],
    checkpoint: Path,
    weights: s3_weights.StagedWeights | None,
    started: float,
    keys: api_keys.LocalKeys | None = None,
) -> int:
    rehearsed = profile.local_profile(deployed, checkpoint, weights.uri if weights else None)
    if args.serve_config:
        import yaml

        rehearsed = yaml.safe_load(args.serve_config.read_text())
    log("== deployed vs rehearsed serve config")
    log(profile.diff(deployed, rehearsed) or "(identical)")
    env = {**profile.worker_env(ray_service), **LOCAL_ENV, **(weights.env if weights else {})}
    log(f"== worker env: {json.dumps(env, sort_keys=True)}")
    model_id = layout.llm_config(deployed, Phase.DECODE)["model_loading_config"]["model_id"]

    report: dict[str, Any] = {"deployed": deployed, "rehearsed": rehearsed, "env": env}
    failover_args: dict[str, Any] = next(iter(layout.failover_settings(deployed)), {})
    threshold = 0 if args.serve_config else int(failover_args.get("short_prompt_tokens", 0))
    if threshold + 64 > profile.LOCAL_MAX_MODEL_LEN:
        log(f"short_prompt_tokens={threshold}: no prompt past it fits the local max_model_len; not probed")
        threshold = 0
    run = Rehearsal(rehearsed, env, model_id, args.timeout_s, started, keys=keys, short_prompt_tokens=threshold)
    status = rehearse_and_judge(report, run, args.report)
    if weights is None or args.serve_config:
        return status
    # Proof of the S3 path: Ray's mirror wrote this run's snapshot (a fresh hash, a cache of the
    # run's own, Hugging Face offline), byte for byte the staged weights.
    decode = layout.llm_config(rehearsed, Phase.DECODE)
    node_copy = Path(decode["model_loading_config"]["model_source"]) if decode.get("callback_config") else None
    from_s3 = weights.loaded_from_s3(model_id, checkpoint, node_copy)
    where = f"the node cache's {node_copy}" if node_copy else "Ray's mirror"
    verdict = "ok" if from_s3 else "FAIL"
    log(f"{verdict}: the engines' weights came from {weights.uri} (snapshot {weights.sha}) through {where}")
    recorded_report = json.loads(args.report.read_text())
    recorded_report["weights"] = {
        "source": weights.uri,
        "snapshot": str(node_copy or weights.snapshot(model_id)),
        "through": "node cache" if node_copy else "Ray's S3 mirror",
        "from_s3": from_s3,
        # Each engine's compile caches, shared in this run's S3 after it started (shared_compile_cache).
        "compile_archives": weights.archives(),
    }
    args.report.write_text(json.dumps(recorded_report, indent=2))
    return status if from_s3 else (status or 1)


if __name__ == "__main__":
    sys.exit(main())
