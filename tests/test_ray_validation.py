"""Ray Serve LLM itself (Ray 2.58.0, the image's version) accepts the serve config we generate,
and rejects the mistakes that would otherwise surface only after a 30-minute deploy."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT
from test_ray_service_chart import ray_service

from eks_pd_serving import versions

RAY_PYTHON = Path(os.environ.get("EKS_PD_RAY_PYTHON", ROOT / ".venv-ray" / "bin" / "python"))
TOOL = ROOT / "tools" / "validate_serve_config.py"

pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(not RAY_PYTHON.exists(), reason=f"{RAY_PYTHON} missing: `make rayenv` creates it"),
]


def run_ray_check(tmp_path: Path, service: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    manifest = tmp_path / "rayservice.json"
    manifest.write_text(json.dumps(service))
    return subprocess.run(
        [str(RAY_PYTHON), str(TOOL), str(manifest)], capture_output=True, text=True, timeout=300, check=False
    )


def test_the_ray_venv_runs_the_images_ray_version() -> None:
    out = subprocess.run(
        [str(RAY_PYTHON), "-c", "import ray; print(ray.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == versions.RAY_VERSION


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"gpu_instance_type": "g6.12xlarge", "prefill_replicas": 2, "kv_buffer_device": "cpu"},
        {
            "gpu_layout": "per_phase",
            "prefill_gpu_instance_type": "g6e.8xlarge",
            "decode_gpu_node_count": 2,
            "decode_replicas": 2,
        },
    ],
    ids=["default", "two-prefill-replicas", "per-phase"],
)
def test_ray_accepts_the_generated_serve_config(tmp_path: Path, settings: dict[str, Any]) -> None:
    result = run_ray_check(tmp_path, ray_service(**settings))
    assert result.returncode == 0, result.stderr
    accepted = "application 'pd-openai' accepted: model 'qwen3.5-9b', prefill kv_producer, decode kv_consumer"
    assert f"ray 2.58.0: {accepted}" in result.stdout


def _edit_args(service: dict[str, Any], edit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    serve = yaml.safe_load(service["spec"]["serveConfigV2"])
    edit(serve["applications"][0]["args"])
    service["spec"]["serveConfigV2"] = yaml.safe_dump(serve)
    return service


def _kv_beside_engine_kwargs(args: dict[str, Any]) -> None:
    side = args["prefill_config"]
    side["kv_transfer_config"] = side["engine_kwargs"].pop("kv_transfer_config")


BROKEN: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("kv_transfer_config beside engine_kwargs", _kv_beside_engine_kwargs, "Extra inputs are not permitted"),
    (
        "model ids differ",
        lambda a: a["decode_config"]["model_loading_config"].update(model_id="other"),
        "P/D model id mismatch",
    ),
    (
        "no kv_transfer_config on decode",
        lambda a: a["decode_config"]["engine_kwargs"].pop("kv_transfer_config"),
        "kv_transfer_config is required for P/D disaggregation",
    ),
    ("unknown PDServingArgs key", lambda a: a.update(router_config={}), "Extra inputs are not permitted"),
    (
        "bad replica count",
        lambda a: a["decode_config"]["deployment_config"].update(num_replicas=-1),
        "num_replicas",
    ),
]


@pytest.mark.parametrize(("_name", "edit", "message"), BROKEN, ids=[b[0] for b in BROKEN])
def test_ray_rejects_a_broken_serve_config(
    tmp_path: Path, _name: str, edit: Callable[[dict[str, Any]], None], message: str
) -> None:
    result = run_ray_check(tmp_path, _edit_args(ray_service(), edit))
    assert result.returncode == 1
    assert "rejected by Ray" in result.stderr and message in result.stderr, result.stderr
