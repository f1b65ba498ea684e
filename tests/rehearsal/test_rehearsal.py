"""The rehearsal itself: the synthesized serve application on this CPU (Ray Serve 2.60, vLLM CPU
0.32, NIXL over UCX), probed as a client would, and a broken config failing with Ray's message."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import psutil
import pytest
import yaml
from support import ROOT, log_filter_matches

from eks_pd_serving import observability as om
from eks_pd_serving.k8s import serve_config as layout
from eks_pd_serving.phase import Phase
from rehearsal import profile

PYTHON = Path(os.environ.get("EKS_PD_REHEARSE_PYTHON", ROOT / ".venv-rehearse" / "bin" / "python"))
MARKER = "EKS_PD_REHEARSAL_RUN"

pytestmark = [
    pytest.mark.rehearsal,
    pytest.mark.skipif(not PYTHON.exists(), reason=f"{PYTHON} missing: `make rehearse` installs it"),
]


def rehearse(
    tmp_path: Path,
    template: Path,
    *extra: str,
    module: str = "rehearsal.run",
    report: str = "report.json",
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """The rehearsal as a user runs it, its processes marked with this test's own run id."""
    return subprocess.run(
        [
            str(PYTHON), "-m", module,
            "--template", str(template),
            "--checkpoint", str(tmp_path.parent / "tiny-checkpoint"),
            "--report", str(tmp_path / report),
            *extra,
        ],
        cwd=ROOT, env={**os.environ, **(env or {}), MARKER: run_id(tmp_path)}, capture_output=True, text=True,
        timeout=900,
        check=False,
    )  # fmt: skip


def run_id(tmp_path: Path) -> str:
    return f"test-{tmp_path.parent.name}-{tmp_path.name}"


def leftovers(tmp_path: Path) -> list[int]:
    """Processes of this test's rehearsal still alive (another test's may run beside it)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(MARKER) == run_id(tmp_path):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


@pytest.fixture(scope="module")
def autoscaled_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The app with decode autoscaling from 1 to 2 replicas at a target of 1 request (prefill fixed
    at 1), and the API key check on every Serve proxy: its serve config is the default one plus
    the autoscaling keys (test_rehearsal_profile.py asserts that), so one run rehearses all three."""
    from support import synth_assembly

    return synth_assembly(
        tmp_path_factory.mktemp("cdk.out"), nag=False, autoscaling=True, prefill_max_replicas=1,
        decode_max_replicas=2, decode_target_ongoing_requests=1, api_keys=True,
    )  # fmt: skip


def test_the_deployed_serve_app_moves_kv_from_prefill_to_decode_and_scales_decode(
    tmp_path: Path, autoscaled_template: Path
) -> None:
    canary = "canaryKey" + "0123456789abcdefghijklmnopqrstuvwxyzABCDEF"
    result = rehearse(tmp_path, autoscaled_template, env={"EKS_PD_REHEARSAL_API_KEY": canary})
    print(result.stdout[-6000:])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "PASS: every request's KV came from prefill over NIXL" in result.stdout
    # What a client may not do (issues 56 and 65): each refused before an engine acts on it.
    assert "PASS: client transfer params: [400] for 44 requests, 0 connections to the listener" in result.stdout
    assert "PASS: no engine restarted:" in result.stdout
    assert "PASS: client templates and tokenize: [400] for 3 requests" in result.stdout
    assert "PASS: rendered fields at 2 MB and token ids past max_model_len: [400] for 7 requests" in result.stdout
    assert (
        "PASS: 64 MB with and without Content-Length at the Serve proxy, then 2,000,000 token ids: [413, 413, 400]"
        in (result.stdout)
    )
    assert "PASS: an adapter id without adapters: HTTP 404; the next request HTTP 200 on {'disaggregated'" in (
        result.stdout
    )
    assert "PASS: a 2 MB chat: HTTP [400]" in result.stdout
    assert "+            - UCX" in result.stdout or "+        - UCX" in result.stdout  # the diff was shown
    assert "+      upscale_delay_s: 2.0" in result.stdout  # the one local autoscaling change, shown
    report = json.loads((tmp_path / "report.json").read_text())
    # The weights took the deployed S3 path (moto's server, the deployed prefix, HF offline): Ray's
    # mirror wrote this run's own snapshot, byte for byte the staged checkpoint.
    assert report["weights"]["from_s3"] is True
    assert report["weights"]["source"] == "s3://rehearsal-model-weights/models/Qwen/Qwen3.5-9B/main"
    assert "ok: the engines' weights came from s3://rehearsal-model-weights/" in result.stdout
    # The node cache filled in each engine's replica and Ray Serve LLM skipped its per-node download
    # tasks (issue 66): every engine start's split, from Serve's own log files, says so.
    starts = report["replica_starts"]
    assert {s["deployment"].split(":")[0] for s in starts} == {"Prefill", "Decode"}
    assert {s["node_init_how"] for s in starts} == {"in the replica"}, starts
    assert all(s["parts_s"]["node_init"] is not None for s in starts)
    # Each engine's compile caches (shared_compile_cache, the default): looked for before it started
    # (the split's line), then shared once it served: one archive per engine, in this run's S3.
    assert all(str(s["compile_caches"]).startswith("compile caches: ") for s in starts), starts
    engines = [llm for _, llm in layout.phase_llm_configs(report["rehearsed"])]
    keys = {llm["callback_config"]["callback_kwargs"]["compiled"] for llm in engines}
    assert len(keys) == 2 and report["weights"]["compile_archives"] == sorted(keys)
    requests = report["pd"]["requests"]
    assert [r["kind"] for r in requests].count("stream") == 4
    for request in requests:
        assert request["engine"]["external_kv_tokens"] == request["prompt_tokens"] - 1
        assert request["engine"]["nixl_transfers"] >= 1
    for control in report["colocated"]["requests"]:
        assert control["engine"]["external_kv_tokens"] == 0 and control["engine"]["nixl_transfers"] == 0
    assert [r["text"] for r in requests] == [r["text"] for r in report["colocated"]["requests"]]
    assert report["pd"]["errors"] == {"malformed": 400, "unknown_model": 404}
    # `verify`'s HTTP check ran against the rehearsal endpoint.
    assert report["pd"]["verify_endpoint"]["models"] == ["qwen3.5-9b"]
    assert 0 < report["pd"]["verify_endpoint"]["ttft_s"] < report["pd"]["verify_endpoint"]["total_s"]
    # The scale-up, from Serve's own status and the engines' counters.
    scaled = report["autoscale"]
    # Serve's running decode replicas, before the bursts and after (the rehearsal's own judge). With
    # each phase an application of its own, a second replica may already be STARTING when the probe
    # begins (seen 2026-12-06: the target of 1 ongoing request is crossed by the plain probes).
    running = {
        k: v.get("RUNNING", 0) for k, v in (("before", scaled["replicas_before"]), ("after", scaled["replicas_after"]))
    }
    assert running == {"before": 1, "after": 2}, scaled
    burst = [r for b in scaled["bursts"] for r in b["requests"]]
    assert scaled["engine"]["external_kv_tokens"] == sum(r["prompt_tokens"] - 1 for r in burst)
    assert "PASS: the added decode replica loaded KV over NIXL" in result.stdout
    # The API key check in front of the PD app: the SDK with the key, 401 everywhere without one
    # or with a wrong one, a rotation with no process restarted; no key in any log or output.
    keyed = report["api_keys"]
    assert keyed["with_key"]["models"] == ["qwen3.5-9b"] and keyed["with_key"]["stream_usage"]["completion_tokens"] > 0
    assert {v["status"] for k, v in keyed["without_key"].items() if k != "GET /-/healthz"} == {401}
    assert {v["error"] for v in keyed["wrong_key"].values()} == {"AuthenticationError"}
    rotation = keyed["rotation"]
    assert rotation["added_s"] <= rotation["bound_s"] and rotation["removed_s"] <= rotation["bound_s"]
    assert rotation["processes_before"] == rotation["processes_after"] != []
    assert keyed["logs"]["files_with_a_key"] == 0 and keyed["logs"]["lines_naming_a_key_id"] > 0
    for text in (result.stdout, result.stderr, (tmp_path / "report.json").read_text()):
        assert canary not in text
    assert result.stdout.count("PASS: api keys:") == 6
    # The workers' RAY_LOG_TO_STDERR=1 (deployed env, not a local addition) puts the engines' NIXL
    # line on the process's own output, as it puts it in a pod's log for `kubectl logs` and verify.
    assert "Backend UCX was instantiated" in result.stdout + result.stderr
    # The UCX alarm's filter pattern selects the lines this run's engines logged (UCX on CPU).
    ucx_lines = [line for line in (result.stdout + result.stderr).splitlines() if om.UCX_LINE in line]
    assert ucx_lines and log_filter_matches(om.UCX_FILTER_PATTERN, ucx_lines) == ucx_lines
    # Ray's endpoint exports every family the dashboard charts, with the type and labels the stack
    # publishes it by; the catalogue tests/template/test_observability.py reads says the same of them.
    live = report["metrics"]
    recorded = json.loads((ROOT / "tests" / "fixtures" / "ray-metrics-catalogue.json").read_text())["families"]
    for metric in om.RAY_METRICS:
        assert live[metric.name]["type"] == metric.kind == recorded[metric.name]["type"], metric.name
        assert set(metric.dimensions) <= set(live[metric.name]["labels"]), metric.name
    # The dashboard's PromQL attributes vLLM's series to a phase by joining their WorkerId to
    # Serve's request counter: every worker that observed a latency or transfer joins to Prefill or
    # Decode, and time to first token is seen in both phases.
    joins = report["metric_joins"]
    for family, joined in joins.items():
        assert joined["unjoined"] == [] and set(joined["deployments"]) <= {"Prefill", "Decode"}, (family, joined)
    assert joins["ray_vllm_time_to_first_token_seconds"]["deployments"] == ["Decode", "Prefill"]
    # Prefill generates one token (no inter-token gap) and decode pulls the KV: both are decode's.
    for family in ("ray_vllm_inter_token_latency_seconds", "ray_vllm_nixl_xfer_time_seconds"):
        assert joins[family]["deployments"] == ["Decode"], family
    assert leftovers(tmp_path) == [], "processes of the rehearsal outlived it"


def test_a_broken_serve_config_fails_with_rays_own_message(tmp_path: Path, template_file: Path) -> None:
    deployed = profile.serve_config(profile.ray_service_from_template(template_file))
    broken = profile.local_profile(deployed, tmp_path.parent / "tiny-checkpoint")
    prefill = layout.llm_config(broken, Phase.PREFILL)
    prefill["kv_transfer_config"] = prefill["engine_kwargs"].pop("kv_transfer_config")
    config = tmp_path / "broken.yaml"
    config.write_text(yaml.safe_dump(broken))
    result = rehearse(tmp_path, template_file, "--serve-config", str(config))
    assert result.returncode == 1
    assert "REHEARSAL FAILED: ValidationError" in result.stdout
    assert "kv_transfer_config" in result.stdout and "Extra inputs are not permitted" in result.stdout
    assert leftovers(tmp_path) == []
