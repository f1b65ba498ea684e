"""The GPU rehearsal's parts that need no GPU: its profile, the budget emulation arithmetic, the
parsing of vLLM's profiler log, the Qwen3.5 checkpoint shapes and the benchmark statistics. The
GPU runs themselves (`make rehearse-gpu`, `emulate-gpu`, `bench-gpu`) are in docs/gpu-runs with
their dates and machine; tests/rehearsal/ checks that without a GPU the entry point says so."""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any

import pytest
from support import ROOT, leaves

from eks_pd_serving.catalog import MODELS
from eks_pd_serving.k8s import serve_config as layout
from eks_pd_serving.phase import Phase
from eks_pd_serving.sizing import GIB, MIB
from rehearsal import bench, gpu_profile, profile, qwen35_checkpoint, tiny_checkpoint

FIXTURES = ROOT / "tests" / "fixtures"
H200 = gpu_profile.GpuHost(gpus=2, total_bytes=int(139.8 * GIB), name="NVIDIA H200")


# The engines load the local checkpoint: the node cache's folder and callback go.
LOCAL_WEIGHTS = ("model_loading_config/model_source", "callback_config/callback_class",
                 "callback_config/callback_kwargs/source", "callback_config/callback_kwargs/compiled")  # fmt: skip


def _changed(deployed: dict[str, Any], rehearsed: dict[str, Any]) -> set[str]:
    """The leaves the profile changed: an engine's as ``<phase>_config/<path>``, the failover's
    settings as ``failover/<key>`` (wherever the config holds them)."""
    before, after = _by_phase(deployed), _by_phase(rehearsed)
    removed = set(before) - set(after)  # only the node cache's callback: the checkpoint is local
    assert all("/callback_config/" in k for k in removed), removed
    return {k for k in after if before.get(k) != after[k]} | removed


def _by_phase(serve_config: dict[str, Any]) -> dict[str, Any]:
    found = {
        f"{phase}_config{path}": v
        for phase, llm in layout.phase_llm_configs(serve_config)
        for path, v in leaves(llm).items()
    }
    found |= {f"failover/{k}": v for settings in layout.failover_settings(serve_config) for k, v in settings.items()}
    return found


@pytest.fixture(scope="module")
def deployed(template_file: Path) -> dict[str, Any]:
    return profile.serve_config(profile.ray_service_from_template(template_file))


def test_the_deployed_s3_source_maps_back_to_its_catalogue_row(deployed: dict[str, Any]) -> None:
    """issue 37: `emulate` on the default template raised KeyError on the s3:// model source."""
    from eks_pd_serving.weights import weights_prefix

    prefill = layout.llm_config(deployed, Phase.PREFILL)
    source = profile.weights_source(prefill)  # the node cache fills the engines' folder from it
    assert source.startswith("s3://") and source not in MODELS
    assert gpu_profile.catalogue_source(source) == "Qwen/Qwen3.5-9B"
    uri = f"s3://bucket/{weights_prefix('meta-llama/Llama-3.1-70B-Instruct', 'abc123')}"
    assert gpu_profile.catalogue_source(uri) == "meta-llama/Llama-3.1-70B-Instruct"
    assert gpu_profile.catalogue_source("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B"
    engine = prefill["engine_kwargs"]
    assert gpu_profile.sizing_for(engine, gpu_profile.catalogue_source(source), "L4").kv_capacity_tokens > 0


def test_two_gpus_change_only_model_kernels_and_backend(deployed: dict[str, Any]) -> None:
    rehearsed = gpu_profile.gpu_profile(deployed, Path("/m"), H200, dummy_weights=True)
    assert _changed(deployed, rehearsed) == {
        f"{side}/{key}"
        for side in gpu_profile.SIDES
        for key in (
            *LOCAL_WEIGHTS,
            "engine_kwargs/load_format",
            "engine_kwargs/gdn_prefill_backend",
            "engine_kwargs/kv_transfer_config/kv_connector_extra_config/backends",
            "runtime_env/env_vars/VLLM_DP_MASTER_PORT",
        )
    } | {"failover/short_prompt_tokens"}
    decode = layout.llm_config(rehearsed, Phase.DECODE)["engine_kwargs"]
    assert decode["kv_transfer_config"]["kv_buffer_device"] == "cuda"
    assert decode["kv_transfer_config"]["kv_connector_extra_config"]["backends"] == ["UCX"]
    assert decode["language_model_only"] is True  # text-only as deployed


def test_an_efa_host_with_flashinfer_keeps_the_deployed_backend_and_kernels(deployed: dict[str, Any]) -> None:
    host = dataclasses.replace(H200, efa=True, flashinfer=True)
    rehearsed = gpu_profile.gpu_profile(deployed, Path("/m"), host, dummy_weights=False)
    assert _changed(deployed, rehearsed) == {
        f"{side}/{key}"
        for side in gpu_profile.SIDES
        for key in (*LOCAL_WEIGHTS, "runtime_env/env_vars/VLLM_DP_MASTER_PORT")
    } | {"failover/short_prompt_tokens"}
    assert gpu_profile.gpu_env({}, host) == {}
    assert gpu_profile.gpu_env({}, H200) == {"VLLM_USE_FLASHINFER_SAMPLER": "0"}


def test_one_gpu_is_shared_by_both_engines(deployed: dict[str, Any]) -> None:
    host = dataclasses.replace(H200, gpus=1)
    rehearsed = gpu_profile.gpu_profile(deployed, Path("/m"), host, dummy_weights=True)
    for side in gpu_profile.SIDES:
        llm = layout.llm_config(rehearsed, Phase(side.removesuffix("_config")))
        assert llm["placement_group_config"]["bundles"][0]["GPU"] == 0.5
        assert llm["engine_kwargs"]["gpu_memory_utilization"] == gpu_profile.SHARED_GPU_UTILIZATION
    # Each engine's Ray worker asks for the bundle's half, not vLLM's default whole GPU.
    assert gpu_profile.gpu_env({}, host)["VLLM_RAY_PER_WORKER_GPUS"] == "0.5"
    assert "VLLM_RAY_PER_WORKER_GPUS" not in gpu_profile.gpu_env({}, H200)


def test_engines_sharing_one_gpu_start_one_after_the_other(deployed: dict[str, Any]) -> None:
    # Two 9B engines profiling at once on one H100 failed six times (2026-12-06): each engine's
    # application is deployed alone first, then the whole config; with a GPU each, all at once.
    shared = gpu_profile.gpu_profile(deployed, Path("/m"), dataclasses.replace(H200, gpus=1), dummy_weights=True)
    steps = gpu_profile.first_deploy_steps(shared)
    assert [[app["name"] for app in step["applications"]] for step in steps] == [
        ["pd-prefill"],
        ["pd-prefill", "pd-decode"],
        ["pd-prefill", "pd-decode", "pd-openai"],
    ]
    assert steps[-1] is shared and steps[0]["applications"][0] is shared["applications"][0]
    own = gpu_profile.gpu_profile(deployed, Path("/m"), H200, dummy_weights=True)
    assert gpu_profile.first_deploy_steps(own) == [own]


def test_the_two_engines_on_one_host_probe_disjoint_tcpstore_ports(deployed: dict[str, Any]) -> None:
    # vLLM 0.26's Ray executor probes data_parallel_master_port + 100 onwards, 32 ports, and takes
    # VLLM_DP_MASTER_PORT for that port without data parallelism: unset, both engines probed port
    # 100 (EADDRINUSE on 2026-12-03).
    rehearsed = gpu_profile.gpu_profile(deployed, Path("/m"), dataclasses.replace(H200, gpus=1), dummy_weights=True)
    windows = []
    for side in gpu_profile.SIDES:
        env = layout.llm_config(rehearsed, Phase(side.removesuffix("_config")))["runtime_env"]["env_vars"]
        base = int(env["VLLM_DP_MASTER_PORT"])
        windows.append(set(range(base + 100, base + 132)))
    prefill, decode = windows
    assert prefill.isdisjoint(decode)
    # Clear of the KV link's UCX ports, which the fault rehearsal's packet filter cuts.
    assert all(port < 23000 or port > 23999 for port in prefill | decode)


def test_the_colocated_baseline_is_the_decode_engine_without_a_connector(deployed: dict[str, Any]) -> None:
    rehearsed = gpu_profile.gpu_profile(deployed, Path("/m"), H200, dummy_weights=True)
    (app,) = profile.colocated_control(rehearsed, replicas=2, placement=None)["applications"]
    (llm,) = app["args"]["llm_configs"]
    assert app["import_path"] == "ray.serve.llm:build_openai_app"
    assert llm["deployment_config"]["num_replicas"] == 2
    assert "kv_transfer_config" not in llm["engine_kwargs"]
    assert llm["engine_kwargs"]["load_format"] == "dummy"


def test_emulating_an_l4_gives_vllm_the_l4_budget() -> None:
    utilization = gpu_profile.emulated_utilization("L4", 0.9, H200)
    # vLLM budgets utilization x torch's total; the product must be 0.9 x the L4's 22,888 MiB.
    assert utilization * H200.total_bytes == pytest.approx(0.9 * 22888 * MIB)
    assert gpu_profile.emulated_utilization("l40s", 0.9, H200) == pytest.approx(0.9 * 45776 * MIB / H200.total_bytes)
    # A name with spaces is also taken as its slug, the form a command line takes without quotes.
    assert {gpu_profile.catalog_gpu_bytes(g) for g in ("RTX PRO Server 6000", "rtx-pro-server-6000")} == {98304 * MIB}


@pytest.mark.parametrize(
    ("gpu", "host", "message"),
    [
        ("MI300X", H200, "--emulate-gpu 'MI300X': not in the catalog; use one of a100, a10g, b200, b300, h100, h200"),
        ("L40S", dataclasses.replace(H200, total_bytes=24 * GIB), "exceeds this GPU's memory"),
    ],
)
def test_emulation_refuses_what_it_cannot_emulate(gpu: str, host: gpu_profile.GpuHost, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        gpu_profile.emulated_utilization(gpu, 0.9, host)


# What each recorded profiler log (vllm-0.26.0-profile-<name>.log) says, figure by figure, read
# from the log by hand; "run" says which run wrote it.
PROFILES = json.loads((FIXTURES / "vllm-0.26.0-profile-figures.json").read_text())


@pytest.mark.parametrize("log", sorted(PROFILES))
def test_vllms_profiler_log_is_read_figure_by_figure(log: str) -> None:
    recorded = (FIXTURES / f"vllm-0.26.0-profile-{log}.log").read_text()
    assert gpu_profile.vllm_figures(recorded) == PROFILES[log]["figures"]


def test_the_load_time_is_read_from_both_model_runners_lines() -> None:
    """vLLM 0.26's model runner v1 says "GiB memory and", v2 (dense Llama) "GiB and"."""
    v1 = "Model loading took 56.88 GiB memory and 0.660800 seconds"
    v2 = "Model loading took 15.0 GiB and 1.738765 seconds"
    assert [gpu_profile.vllm_figures(line) for line in (v1, v2)] == [
        {"weights_gib": 56.88, "load_s": 0.6608},
        {"weights_gib": 15.0, "load_s": 1.738765},
    ]


def test_a_log_without_the_profiler_lines_yields_no_figures() -> None:
    assert gpu_profile.vllm_figures("INFO engine started\nERROR CUDA out of memory") == {}


@pytest.mark.parametrize("variant", ["text-only", "multimodal"])
def test_the_emulation_report_compares_within_ten_percent_for_the_9b_as_shipped(variant: str) -> None:
    measured = gpu_profile.vllm_figures((FIXTURES / f"vllm-0.26.0-profile-ssm-float32-{variant}.log").read_text())
    engine = {"dtype": "bfloat16", "max_model_len": 4096, "language_model_only": variant == "text-only",
              "gpu_memory_utilization": 0.9}  # fmt: skip
    rows = gpu_profile.comparison(measured, gpu_profile.sizing_for(engine, "Qwen/Qwen3.5-9B", "L4"))
    assert all(rel is not None and abs(rel) <= 0.10 for _, _, _, rel in rows), rows
    if variant == "text-only":  # the deployed default: every figure within 0.5%
        assert all(rel is not None and abs(rel) <= 0.005 for _, _, _, rel in rows), rows


@pytest.mark.parametrize("variant", ["text-only", "multimodal"])
def test_the_emulation_report_compares_within_ten_percent_for_the_recorded_shape(
    variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recorded run kept the Gated DeltaNet state in bfloat16 (its config named no
    mamba_ssm_dtype); with that shape the report's sizing column is within 10% of vLLM's."""
    recorded_shape = dataclasses.replace(MODELS["Qwen/Qwen3.5-9B"], mamba_ssm_dtype=None)
    monkeypatch.setitem(MODELS, "Qwen/Qwen3.5-9B", recorded_shape)
    measured = gpu_profile.vllm_figures((FIXTURES / f"vllm-0.26.0-profile-{variant}.log").read_text())
    engine = {"dtype": "bfloat16", "max_model_len": 4096, "language_model_only": variant == "text-only",
              "gpu_memory_utilization": 20.03 * GIB / (22888 * MIB)}  # the budget vLLM reported  # fmt: skip
    sizing = gpu_profile.sizing_for(engine, "Qwen/Qwen3.5-9B", "L4")
    rows = {name: rel for name, _, _, rel in gpu_profile.comparison(measured, sizing)}
    assert all(rel is not None and abs(rel) <= 0.10 for rel in rows.values()), rows
    assert len(gpu_profile.comparison_lines(variant, measured, sizing)) == 1 + len(rows)


def test_the_full_checkpoint_is_the_catalogs_qwen35_9b() -> None:
    """The GPU runs' 9B config and the sizing gate's model facts describe one model."""
    ids = {name: i for i, name in enumerate([*tiny_checkpoint.SPECIAL_TOKENS, *qwen35_checkpoint.VISION_TOKENS])}
    text = qwen35_checkpoint.model_config("full", ids)["text_config"]
    facts = MODELS["Qwen/Qwen3.5-9B"]
    assert text["num_hidden_layers"] == facts.num_layers
    assert text["layer_types"].count("full_attention") == facts.full_attention_layers
    assert (text["num_key_value_heads"], text["head_dim"]) == (facts.num_kv_heads, facts.head_dim)
    assert (text["linear_num_key_heads"], text["linear_num_value_heads"]) == (
        facts.linear_num_key_heads,
        facts.linear_num_value_heads,
    )
    assert (text["linear_key_head_dim"], text["linear_value_head_dim"], text["linear_conv_kernel_dim"]) == (
        facts.linear_key_head_dim,
        facts.linear_value_head_dim,
        facts.linear_conv_kernel_dim,
    )
    assert text["mamba_ssm_dtype"] == facts.mamba_ssm_dtype == "float32"
    assert text["max_position_embeddings"] == facts.max_model_len
    tiny = qwen35_checkpoint.model_config("tiny", ids)
    assert tiny["text_config"]["layer_types"] == text["layer_types"][:4]
    assert tiny["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    with pytest.raises(ValueError, match="model shape 'huge'"):
        qwen35_checkpoint.model_config("huge", ids)


def _record(kind: str, sent: float, tokens: list[float], completion: int = 0, error: str = "") -> bench.Request:
    return bench.Request(kind, sent, prompt_tokens=10, completion_tokens=completion, token_s=tokens, error=error)


def test_bench_statistics_are_the_recorded_timings() -> None:
    records = [
        _record("stream", 0.0, [0.1, 0.2, 0.3, 0.5], completion=4),
        _record("stream", 0.0, [0.2, 0.25, 0.3], completion=3),
        _record("long", 1.0, [1.4, 1.5], completion=2),
        _record("long", 2.0, [2.8, 2.9], completion=2),
        _record("long", 3.0, [], error="HTTP 500"),
    ]
    summary = bench.summary(records)
    assert summary["requests"] == 5 and summary["failed"] == 1
    assert summary["long_ttft_ms_p50"] == pytest.approx(600.0)  # 400 and 800 ms
    assert summary["stream_ttft_ms_p50"] == pytest.approx(150.0)
    assert summary["itl_ms_p50"] == pytest.approx(100.0)  # gaps 100, 100, 200, 50, 50 ms
    assert summary["itl_ms_p99"] == pytest.approx(196.0)
    assert summary["stalled_gaps_pct"] == pytest.approx(100 * 3 / 5)  # 100, 100 and 200 ms of 5 gaps
    assert summary["stream_tokens_per_s_p50"] == pytest.approx(statistics.median([3 / 0.4, 2 / 0.1]))
    assert summary["output_tokens_per_s"] == pytest.approx(11 / 2.9)
    table = bench.table({"pd": summary, "colocated": bench.summary(records[:2])})
    assert table.splitlines()[2].startswith("| pd | 600.0 |") and table.splitlines()[2].endswith("| 1 |")
    assert "| colocated | - |" in table


def test_the_runs_bench_table_is_what_the_recorded_runs_give() -> None:
    """docs/gpu-runs/2026-11-30 keeps the `make bench-gpu` runs; its README's table is computed
    from them by this code (change the statistics and this fails until the page follows)."""
    runs = ROOT / "docs" / "gpu-runs" / "2026-11-30"
    loaded = {
        name: bench.summary(records) for name, _, records, _ in map(bench.load, sorted(runs.glob("bench-*.json.gz")))
    }
    table = bench.table({name: loaded[name] for name in ("pd", "colocated")})
    assert table in (runs / "README.md").read_text()
    assert loaded["pd"]["requests"] == loaded["colocated"]["requests"] == 84 and not loaded["pd"]["failed"]


def test_bench_runs_round_trip_through_their_json(tmp_path: Path) -> None:
    workload = bench.Workload(window_s=5)
    records = [_record("stream", 0.0, [0.1, 0.2], completion=2)]
    bench.save(tmp_path / "run.json", "pd", workload, records, {"ready_s": 1.0})
    name, loaded_workload, loaded, data = bench.load(tmp_path / "run.json")
    assert (name, loaded_workload, loaded, data["ready_s"]) == ("pd", workload, records, 1.0)
    assert workload.long_arrivals()[:2] == [5.0, 7.5]


def test_sizing_from_the_full_checkpoints_config_json_matches_the_catalog(tmp_path: Path) -> None:
    """`sizing --config-json` reads mamba_ssm_dtype too: the 9B config gives the catalog's blocks."""
    from eks_pd_serving.cli.sizing_cmd import facts_from_config_json

    ids = {name: i for i, name in enumerate([*tiny_checkpoint.SPECIAL_TOKENS, *qwen35_checkpoint.VISION_TOKENS])}
    (tmp_path / "config.json").write_text(json.dumps(qwen35_checkpoint.model_config("full", ids)))
    facts = facts_from_config_json(tmp_path / "config.json")
    catalog = MODELS["Qwen/Qwen3.5-9B"]
    assert dataclasses.replace(facts, params=catalog.params) == dataclasses.replace(
        catalog, activation_peak_gib=facts.activation_peak_gib, vision_params=0.0, encoder_profile_peak_gib=0.0
    )
