"""Without a GPU, the GPU rehearsal's entry point says so in one line and exits 2 (in the
rehearsal's virtualenv, which has torch)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from support import ROOT


@pytest.mark.skipif(not os.environ.get("EKS_PD_REHEARSE_PYTHON"), reason="needs the rehearsal virtualenv (make test)")
def test_without_a_gpu_the_gpu_rehearsal_says_so_and_exits_2(tmp_path: Path, template_file: Path) -> None:
    python = os.environ["EKS_PD_REHEARSE_PYTHON"]
    done = subprocess.run(
        [python, "-m", "rehearsal.gpu", "rehearse", "--template", str(template_file), "--work-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout.strip() == (
        "the GPU rehearsal needs an NVIDIA GPU that torch can see (none here); `make rehearse` runs on CPU"
    )
    assert "Traceback" not in done.stderr
