"""The failover's building blocks against Ray Serve's own router and replicas
(tests/rehearsal/failover_cases.py), in the rehearsal's virtualenv (Ray 2.60, vLLM 0.32 CPU)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

CASES = Path(__file__).with_name("failover_cases.py")
EXPECTED = (
    "a live replica's chunks stream through unchanged",
    "a server error before the first chunk is refused; a client error and a poisoned refusal pass through",
    "an engine that raises, or answers later than first_s, is refused before any chunk",
    "no replica: refused after wait_s; the plain handle call is still held after 5 s (control)",
    "a replica that dies before its first chunk is refused",
    "a request whose dispatch ended in its engine's death is retried on no other replica",
    "a client's own error passes through as itself, not as the engine's unavailability",
    "a replica that refuses is left for another replica of its phase; with one, refused at once",
    "breaker: skipped for the cooldown, then one probe at a time, closed by a success",
    "a prompt past max_model_len at the longest token is 400 before any tokenizer; one within is not",
    "every role, tool call, tool schema and template option counts; token ids and messages by number",
    "a request is read through an allowlist at every depth: anything else is 400 naming it",
    "engines clear the orchestrator's fields on every path; its body is refused for the cooldown",
    "the builder's args are checked; an engine refuses to start on a Ray and vLLM the record does not cover",
    "another application by name: refused within wait_s before it exists, served once it runs",
    "the callback's after-start hook runs in the background; none, or a failing lookup, fails nothing",
    "prefill refuses a decode of another pair key with a 503 before its engine",
)


@pytest.mark.skipif(not os.environ.get("EKS_PD_REHEARSE_PYTHON"), reason="needs the rehearsal virtualenv (make test)")
def test_the_failover_refuses_before_the_first_chunk_and_bounds_the_routers_wait() -> None:
    ran = subprocess.run(
        [os.environ["EKS_PD_REHEARSE_PYTHON"], str(CASES)], capture_output=True, text=True, timeout=300, check=False
    )
    assert ran.returncode == 0, (ran.stdout[-2000:], ran.stderr[-3000:])
    cases = [line[3:] for line in ran.stdout.splitlines() if line.startswith("ok ")]
    assert cases == list(EXPECTED)


@pytest.mark.skipif(not os.environ.get("EKS_PD_REHEARSE_PYTHON"), reason="needs the rehearsal virtualenv (make test)")
def test_the_rehearsals_ray_has_the_code_the_failover_overrides_unchanged() -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    import ray_upstream

    version, changed = ray_upstream.changed(os.environ["EKS_PD_REHEARSE_PYTHON"])
    assert version == "2.60.0" and changed == []
