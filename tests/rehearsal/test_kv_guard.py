"""The KV guard against vLLM's and Ray's own classes (tests/rehearsal/kv_guard_cases.py), in the
rehearsal's virtualenv (vLLM 0.32 CPU, Ray 2.60): the only one here with both."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

CASES = Path(__file__).with_name("kv_guard_cases.py")
EXPECTED = (
    "failed pulls read from vLLM's own stats",
    "auto stands aside on 0.32, guards 0.26; on guards 0.32; prefill and no-KV engines stand aside; "
    "trips at the first failed pull",
    "refuses to start blind (stats off) or with an unknown mode",
    "waiting request refused within 1 s of the trip; streaming one finishes; new ones refused unstarted",
    "a first chunk arriving with the trip is dropped",
    "control: without the guard the chunk is sent",
)


@pytest.mark.skipif(not os.environ.get("EKS_PD_REHEARSE_PYTHON"), reason="needs the rehearsal virtualenv (make test)")
def test_the_kv_guard_refuses_what_a_failed_pull_affects_and_nothing_else() -> None:
    ran = subprocess.run(
        [os.environ["EKS_PD_REHEARSE_PYTHON"], str(CASES)], capture_output=True, text=True, timeout=300, check=False
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert [line[3:] for line in ran.stdout.splitlines() if line.startswith("ok ")] == list(EXPECTED)
