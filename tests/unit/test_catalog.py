"""The model catalogue: facts read from each model's own config.json, and the sizing of each
architecture class against vLLM 0.26's profiler on the GPU machine (docs/gpu-runs/2026-12-01/
catalog-sizing/: Llama-3.1-8B dense, Qwen3-30B-A3B MoE in bf16, online FP8 and its FP8 checkpoint,
at an H200's budget (p5en per GPU) and an L40S's)."""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
from pathlib import Path
from typing import Any

import pytest
from support import ROOT

from eks_pd_serving.catalog import CATALOG, CONFIGS, DENSE, HYBRID, MODELS, MOE, ModelFacts, facts_from_config
from eks_pd_serving.sizing import GIB, Sizing
from rehearsal import gpu_profile

RUNS = ROOT / "docs" / "gpu-runs" / "2026-12-01" / "catalog-sizing"


def test_every_catalogue_config_is_a_vendored_file_and_reads_back() -> None:
    assert sorted(entry.config for entry in CATALOG.values()) == sorted(p.name for p in CONFIGS.glob("*.json"))
    for source, entry in CATALOG.items():
        raw = json.loads((CONFIGS / entry.config).read_text())
        assert MODELS[source] == dataclasses.replace(
            facts_from_config(raw), activation_peak_gib=entry.activation_peak_gib
        )


def test_architecture_classes() -> None:
    classes = {source: facts.architecture for source, facts in MODELS.items()}
    assert classes["Qwen/Qwen3.5-9B"] == HYBRID
    assert {classes[s] for s in ("meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-8B", "Qwen/Qwen3-32B")} == {DENSE}
    assert classes["Qwen/Qwen3-30B-A3B"] == classes["Qwen/Qwen3-30B-A3B-FP8"] == MOE
    assert MODELS["Qwen/Qwen3-30B-A3B-FP8"].checkpoint_quantization == "fp8"


def test_parameter_counts_follow_from_the_shapes() -> None:
    """Llama-3.1-8B by hand: embeddings and LM head 2 x 128256 x 4096; per layer q and o 4096^2 each,
    k and v 4096 x 1024 each, MLP 3 x 4096 x 14336."""
    llama = MODELS["meta-llama/Llama-3.1-8B-Instruct"]
    per_layer = 2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336
    assert llama.params == 2 * 128256 * 4096 + 32 * per_layer
    moe = MODELS["Qwen/Qwen3-30B-A3B"]  # 128 experts of 3 x 2048 x 768 a layer, and the router
    assert moe.linear_params - 48 * (2048 * 4096 * 2 + 2 * 2048 * 512) == 48 * 128 * 3 * 2048 * 768


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"quantization_config": {"quant_method": "mxfp4"}}, "quant_method='mxfp4' is not one sizing knows"),
        ({"num_experts": 8}, "num_experts is set but moe_intermediate_size is not"),
    ],
)
def test_configs_sizing_cannot_size_are_refused(config: dict[str, Any], message: str) -> None:
    raw = json.loads((CONFIGS / CATALOG["Qwen/Qwen3-8B"].config).read_text())
    with pytest.raises(ValueError, match=re.escape(message)):
        facts_from_config({**raw, **config})


def _recorded_runs() -> list[tuple[str, str, dict[str, Any], int, dict[str, float]]]:
    """(run, GPU, engine kwargs, host bytes, vLLM's figures) of every recorded engine: the kwargs and
    host from the run's output, vLLM's KV figures from its comparison table."""
    runs = []
    for out in sorted(RUNS.glob("*.out")):
        text = out.read_text()
        host_bytes = int(re.search(r"total_bytes=(\d+)", text).group(1))  # type: ignore[union-attr]
        gpu = re.search(r"== (\S+) budget on", text).group(1)  # type: ignore[union-attr]
        for variant, kwargs in re.findall(r"^== ([\w-]+): (\{.*\})$", text, re.M):
            figures = {
                name: float(value)
                for name, value in re.findall(rf"^{variant}: (kv_tokens|kv_gib)\s+([\d.]+)", text, re.M)
            }
            runs.append((f"{out.stem}/{variant}", gpu, json.loads(kwargs), host_bytes, figures))
    return runs


RECORDED = _recorded_runs()


def _sized(kwargs: dict[str, Any], gpu: str, host_bytes: int, model: ModelFacts | None = None) -> Sizing:
    """The gate's sizing for the recorded engine at the deployed utilization (the emulated one
    scaled back to the emulated GPU's memory)."""
    deployed = kwargs["gpu_memory_utilization"] * host_bytes / gpu_profile.catalog_gpu_bytes(gpu)
    return gpu_profile.sizing_for({**kwargs, "gpu_memory_utilization": round(deployed, 6)}, _source(kwargs), gpu, model)


def _source(kwargs: dict[str, Any]) -> str:
    """The catalogue model a run's checkpoint directory was built for (catalog_checkpoint names it)."""
    return next(s for s in CATALOG if Path(kwargs["model"]).name == s.replace("/", "--"))


def test_every_recorded_run_is_read() -> None:
    assert len(RECORDED) == 6 and all(set(r[4]) == {"kv_tokens", "kv_gib"} for r in RECORDED)
    assert {r[1] for r in RECORDED} == {"H200", "L40S"}


@pytest.mark.parametrize(("run", "gpu", "kwargs", "host_bytes", "vllm"), RECORDED, ids=[r[0] for r in RECORDED])
def test_sizing_matches_vllms_profiler_within_five_percent(
    run: str, gpu: str, kwargs: dict[str, Any], host_bytes: int, vllm: dict[str, float]
) -> None:
    sizing = _sized(kwargs, gpu, host_bytes)
    assert sizing.kv_capacity_tokens == pytest.approx(vllm["kv_tokens"], rel=0.05)
    assert sizing.kv_budget_bytes / GIB == pytest.approx(vllm["kv_gib"], rel=0.05)


def test_the_comparison_fails_on_wrong_model_facts() -> None:
    """Half the KV heads (a misread config) doubles the tokens: the 5% check catches it."""
    _run, gpu, kwargs, host_bytes, vllm = RECORDED[0]
    right = MODELS[_source(kwargs)]
    wrong = dataclasses.replace(right, num_kv_heads=right.num_kv_heads // 2)
    sizing = _sized(kwargs, gpu, host_bytes, wrong)
    assert sizing.kv_capacity_tokens != pytest.approx(vllm["kv_tokens"], rel=0.05)


@pytest.mark.parametrize("log", sorted(RUNS.glob("*.log.gz")), ids=lambda p: p.name)
def test_weights_match_what_vllm_loaded(log: Path) -> None:
    """vLLM's "Model loading took N GiB" against the sizing's weights, within 1%."""
    text = gzip.decompress(log.read_bytes()).decode()
    figures = gpu_profile.vllm_figures(text)
    out = RUNS / (log.name.split("-emulate")[0] + ".out")
    _run, gpu, kwargs, host_bytes, _vllm = next(r for r in RECORDED if r[0].startswith(out.stem + "/"))
    sizing = _sized(kwargs, gpu, host_bytes)
    assert sizing.weight_bytes / GIB == pytest.approx(figures["weights_gib"], rel=0.01)
