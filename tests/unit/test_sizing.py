"""Sizing against figures worked out by hand for Qwen3.5-9B on one L4 (g6.8xlarge), and against
what vLLM 0.26.0's own profiler reported for the same shape (../shared/gpu/kv-capacity-2026-11-30.txt).

By hand, text only (the default). Qwen3.5's config.json names mamba_ssm_dtype float32, and vLLM
0.26 keeps the Gated DeltaNet state in it (model_executor/models/config.py), so the state is
4 B per element while the convolution window and the KV stay bfloat16:
  GPU memory     22,888 MiB (EC2 reports for the L4)                = 23,999,807,488 B
  usable x 0.90                                                     = 21,599,826,739 B
  weights        9.02e9 params x 2 B (bf16)                          = 18,040,000,000 B
  activations    1.0 GiB peak + 0.23 GiB non-torch                   =  1,320,702,443 B
  KV cache       usable - weights - activations                      =  2,239,124,296 B
  Mamba page     3 x (2 x 16 x 128 + 32 x 128) x 2 + 32 x 128 x 128 x 4 = 2,146,304 B per layer
  attention      2 x 4 KV heads x 256 x 2 B = 4,096 B per token per layer
  block size     16 x ceil(2,146,304 / (16 x 4,096))                 = 528 tokens (page 2,162,688 B)
  groups         8 full-attention layers: 1 group of 8; 24 linear: 3 groups of 8
  block          8 layers x 2,162,688 B                              =     17,301,504 B
  blocks         2,239,124,296 // 17,301,504                         = 129
  per sequence   ceil(4,096 / 528) = 8 attention blocks + 3 linear   = 11 blocks (190,316,544 B)
  concurrency    129 / 11 = 11.73; capacity 11.73 x 4,096           = 48,034 tokens
  transfer       190,316,544 x 8 / 25e9 s = 60.90 ms (EFA); / 5e9 s = 304.51 ms (one TCP flow)
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from support import ROOT

from eks_pd_serving.catalog import INSTANCE_TYPES, MODELS, ModelFacts
from eks_pd_serving.config import ConfigError, DeploymentConfig
from eks_pd_serving.phase import Phase
from eks_pd_serving.sizing import GIB, MIB, VLLM_DEFAULT_MAX_NUM_SEQS, activation_gib, size

QWEN = MODELS["Qwen/Qwen3.5-9B"]
L4 = INSTANCE_TYPES["g6.8xlarge"]


AT_VLLMS_DEFAULT = {"prefill_max_num_seqs": 256, "decode_max_num_seqs": 256}


def test_default_deployment_by_hand() -> None:
    """At vLLM's own max_num_seqs (256), what the recorded runs used."""
    sizing = DeploymentConfig.create(**AT_VLLMS_DEFAULT).sizing(Phase.DECODE)
    assert sizing is not None
    assert sizing.gpu_bytes == 23_999_807_488
    assert sizing.usable_bytes == 21_599_826_739
    assert sizing.weight_bytes == 18_040_000_000
    assert sizing.activation_bytes == 1_320_702_443
    assert sizing.kv_budget_bytes == 2_239_124_296
    assert (sizing.block_tokens, sizing.page_bytes, sizing.block_bytes) == (528, 2_162_688, 17_301_504)
    assert (sizing.layers_per_group, sizing.attention_groups, sizing.linear_groups) == (8, 1, 3)
    assert (sizing.num_blocks, sizing.blocks_per_sequence) == (129, 11)
    assert sizing.concurrency == pytest.approx(129 / 11)
    assert (sizing.kv_capacity_tokens, sizing.max_concurrent_sequences) == (48_034, 11)
    assert sizing.bytes_per_full_sequence == 190_316_544
    assert sizing.transfer_ms(25) == pytest.approx(60.90, abs=0.01)
    assert sizing.transfer_ms(5) == pytest.approx(304.51, abs=0.01)


# vLLM 0.26.0's profiler, Qwen3.5-9B shape, dummy weights, an L4's budget emulated on an H200,
# max_num_batched_tokens 2048 (what vLLM picks on an L4 for a server). Per (Gated DeltaNet state
# dtype, variant): (budget GiB vLLM requested, weights GiB, activation peak GiB, available KV GiB,
# KV blocks, block tokens, GPU KV cache tokens, maximum concurrency at 4,096 tokens).
# - float32 state, as the checkpoint ships (mamba_ssm_dtype): `make emulate-gpu`, 2026-11-30,
#   docs/gpu-runs/2026-11-30/emulate.out and tests/fixtures/vllm-0.26.0-profile-ssm-float32-*.log;
# - bfloat16 state: an earlier run whose config named no mamba_ssm_dtype
#   (../shared/gpu/kv-capacity-2026-11-30.txt, tests/fixtures/vllm-0.26.0-profile-*.log).
RECORDED = {
    ("float32", "text only"): (0.9 * 22888 / 1024, 16.8, 1.0, 2.09, 129, 528, 48_034, 11.73),
    ("float32", "multimodal"): (0.9 * 22888 / 1024, 17.66, 1.92, 0.31, 19, 528, 7_074, 1.73),
    ("bfloat16", "text only"): (20.03, 16.8, 1.0, 2.0, 240, 272, 51_738, 12.63),
    ("bfloat16", "multimodal"): (20.03, 17.66, 1.92, 0.22, 26, 272, 5_605, 1.37),
}


def _shape(state_dtype: str) -> ModelFacts:
    return dataclasses.replace(QWEN, mamba_ssm_dtype=None if state_dtype == "bfloat16" else state_dtype)


@pytest.mark.parametrize(("state", "variant"), sorted(RECORDED))
def test_sizing_agrees_with_vllms_profiler_within_ten_percent(state: str, variant: str) -> None:
    budget, weights, peak, kv, blocks, block_tokens, tokens, concurrency = RECORDED[state, variant]
    sizing = size(
        _shape(state), L4, dtype="bfloat16", tensor_parallel_size=1, gpu_memory_utilization=1.0,
        max_model_len=4096, multimodal=variant == "multimodal", gpu_bytes=int(budget * GIB),
        max_num_seqs=VLLM_DEFAULT_MAX_NUM_SEQS,  # what vLLM profiled with in these runs
    )  # fmt: skip
    assert sizing.block_tokens == block_tokens
    assert sizing.weight_bytes / GIB == pytest.approx(weights, rel=0.10)
    assert sizing.activation_bytes / GIB == pytest.approx(peak + 0.23, rel=0.10)  # + non-torch memory
    assert sizing.num_blocks == pytest.approx(blocks, rel=0.10)
    assert sizing.kv_budget_bytes / GIB == pytest.approx(kv, rel=0.10)
    assert sizing.kv_capacity_tokens == pytest.approx(tokens, rel=0.10)
    assert sizing.concurrency == pytest.approx(concurrency, rel=0.10)


@pytest.mark.parametrize(("state", "variant"), sorted(RECORDED))
def test_given_vllms_kv_memory_the_block_model_gives_vllms_block_count(state: str, variant: str) -> None:
    """The block-size rule, the groups and the per-request blocks alone, with vLLM's own KV
    memory: the same block count and concurrency as its log."""
    *_, kv, blocks, block_tokens, tokens, concurrency = RECORDED[state, variant]
    sizing = size(_shape(state), L4, dtype="bfloat16", tensor_parallel_size=1, gpu_memory_utilization=1.0,
                  max_model_len=4096, max_num_seqs=VLLM_DEFAULT_MAX_NUM_SEQS)  # fmt: skip
    assert sizing.block_tokens == block_tokens
    assert int(kv * GIB) // sizing.block_bytes == blocks
    assert blocks / sizing.blocks_per_sequence == pytest.approx(concurrency, abs=0.005)
    assert int(blocks / sizing.blocks_per_sequence * 4096) == pytest.approx(tokens, abs=1)


def test_the_default_deployment_pins_max_num_seqs_to_what_its_kv_cache_holds() -> None:
    """vLLM's default (256 sequences) sets the profiling peak at 1.00 GiB and leaves 48,034 KV tokens;
    pinned at the sizing's own figure (15 full-length sequences), the peak drops and the KV cache
    holds 62,557 tokens. At 16, what vLLM ran on 2026-12-01, the gate gives its figures exactly."""
    decode = DeploymentConfig().sizing(Phase.DECODE)
    assert decode is not None and decode.max_num_seqs == 15 and decode.concurrency >= 15
    assert decode.kv_capacity_tokens == 62_557
    at_256 = DeploymentConfig.create(decode_max_num_seqs=256).sizing(Phase.DECODE)
    *_, blocks, block_tokens, tokens, _ = RECORDED["float32", "text only"]
    assert at_256 is not None and (at_256.num_blocks, at_256.block_tokens, at_256.kv_capacity_tokens) == (
        blocks, block_tokens, tokens)  # fmt: skip
    at_16 = DeploymentConfig.create(decode_max_num_seqs=16).sizing(Phase.DECODE)
    assert at_16 is not None and (at_16.num_blocks, at_16.kv_capacity_tokens) == (167, 62_184)


def test_tensor_parallelism_splits_weights_and_kv() -> None:
    sizing = size(
        QWEN, INSTANCE_TYPES["g6.12xlarge"], dtype="bfloat16", tensor_parallel_size=2,
        gpu_memory_utilization=0.9, max_model_len=4096,
    )  # fmt: skip
    assert sizing.weight_bytes == 9_020_000_000
    assert sizing.kv_bytes_per_token == 16_384
    assert sizing.state_bytes_per_sequence == 25_755_648  # 24 x 2,146,304 / 2


def test_a_dense_model_uses_16_token_blocks_in_one_group() -> None:
    dense = QWEN.__class__(params=QWEN.params, max_model_len=4096, num_layers=32, full_attention_layers=32,
                           num_kv_heads=4, head_dim=256)  # fmt: skip
    sizing = size(dense, L4, dtype="bfloat16", tensor_parallel_size=1, gpu_memory_utilization=0.9, max_model_len=4096)
    assert sizing.kv_bytes_per_token == 4 * 32_768 and sizing.state_bytes_per_sequence == 0
    assert (sizing.block_tokens, sizing.layers_per_group, sizing.blocks_per_sequence) == (16, 32, 256)


def test_synth_rejects_what_vllm_would_refuse_to_start() -> None:
    # 32,768 tokens: 63 attention blocks + 3 = 66 per sequence; 129 blocks fit: concurrency 1.95.
    longer = DeploymentConfig.create(max_model_len=32_768, **AT_VLLMS_DEFAULT).sizing(Phase.DECODE)
    assert longer is not None and longer.max_concurrent_sequences == 1
    # 131,072 tokens: 249 + 3 = 252 blocks per sequence > 129.
    with pytest.raises(ConfigError, match=r"^max_model_len=131072 .* needs 252 KV blocks .* but only 129 fit"):
        DeploymentConfig.create(max_model_len=131_072, **AT_VLLMS_DEFAULT)


def test_the_vision_tower_is_refused_where_it_leaves_no_kv_cache() -> None:
    # With the vision tower at gpu_memory_utilization 0.85: 19.00 GiB - 17.66 - 2.15 < 0.
    with pytest.raises(ConfigError, match=r"the weights and activations need 19.8 GiB per GPU but .* leaves 19.0 GiB"):
        DeploymentConfig.create(multimodal=True, gpu_memory_utilization=0.85, **AT_VLLMS_DEFAULT)


def test_low_concurrency_warns() -> None:
    warnings = DeploymentConfig.create(multimodal=True, **AT_VLLMS_DEFAULT).warnings()
    assert any(w.startswith("prefill: only 1.73 sequences of max_model_len=4096") for w in warnings), warnings
    assert not any("sequences of max_model_len" in w for w in DeploymentConfig().warnings())


def test_synth_rejects_weights_that_do_not_fit() -> None:
    with pytest.raises(ConfigError, match=r"the weights and activations need 34.8 GiB per GPU but"):
        DeploymentConfig.create(dtype="float32", **AT_VLLMS_DEFAULT)


def test_the_multimodal_engine_warns_as_vllms_profiler_measured_it() -> None:
    """The vision encoder's profiling peak (1.91 GiB) does not shrink with max_num_seqs, so even with
    pinned batch limits the multimodal engine holds under two max_model_len sequences on an L4
    (vLLM: 1.73 at 15 sequences, 2026-12-03); text only it holds the default 15."""
    warnings = DeploymentConfig.create(multimodal=True).warnings()
    assert any(w.startswith("decode: only 1.73 sequences of max_model_len=4096") for w in warnings), warnings
    assert not any("sequences of max_model_len" in w for w in DeploymentConfig().warnings())


# vLLM 0.26.0's profiler on the default template's engine (max_num_seqs pinned at 15), an L4's
# budget emulated on an H200: `python -m rehearsal.gpu emulate`, 2026-12-03.
EMULATED = ROOT / "docs/gpu-runs/2026-12-03/emulate-default-template/report.json"


@pytest.mark.parametrize("variant", ["text-only", "multimodal"])
def test_sizing_is_within_five_percent_of_vllm_at_the_pinned_max_num_seqs(variant: str) -> None:
    from rehearsal import gpu_profile

    run = json.loads(EMULATED.read_text())[variant]
    engine = {**run["engine"], "gpu_memory_utilization": 0.9}  # the deployed fraction of an L4
    sizing = gpu_profile.sizing_for(engine, "Qwen/Qwen3.5-9B", "L4")
    assert run["engine"]["max_num_seqs"] == 15
    assert sizing.activation_bytes / GIB - 0.23 == pytest.approx(run["vllm"]["activation_peak_gib"], rel=0.05)
    # Multimodal, the KV cache is 19 blocks at this budget, so one block is 5.3%: the same block
    # count; text only, within 1%.
    assert abs(sizing.num_blocks - run["vllm"]["num_blocks"]) <= (0 if variant == "multimodal" else 2)
    tolerance = 0.05 if variant == "multimodal" else 0.01
    assert sizing.kv_capacity_tokens == pytest.approx(run["vllm"]["kv_tokens"], rel=tolerance)


def test_the_encoder_peak_is_the_runs_byte_exact_kv_difference() -> None:
    """The catalogue's encoder share (``encoder_profile_peak_gib``) is what the 2026-12-03 run's two
    engines measured, from vLLM's byte-exact ``--kv-cache-memory`` figures rather than its figures
    printed to 0.01 GiB: the KV memory the vision tower's engine lacks, less its weights, over the
    text engine's peak at the same 15 sequences."""
    import gzip
    import re

    def fit(variant: str) -> int:
        with gzip.open(EMULATED.with_name(f"emulate-{variant}.log.gz"), "rt") as log:
            text = log.read()
        return int(re.search(r"--kv-cache-memory=(\d+)`? \(\S+ GiB\) to fit", text).group(1))  # type: ignore[union-attr]

    extra = fit("text-only") - fit("multimodal") - QWEN.vision_params * 2  # bf16 vision weights
    assert extra / MIB == pytest.approx(1568.34, abs=0.01)
    multimodal_peak = activation_gib(QWEN, "none", True, 15) + extra / GIB
    assert QWEN.activation_peak_gib + QWEN.encoder_profile_peak_gib == pytest.approx(multimodal_peak, abs=0.001)


# --- engine choices: FP8 weights and CUDA graphs, against vLLM's profiler on 2026-12-01 ---------
# (quantization, enforce_eager) -> vLLM 0.26.0's KV tokens and blocks at an L4 budget, text only,
# max_num_seqs 16 (docs/gpu-runs/2026-12-01/engine-choices/).
ENGINE_RUNS = {("none", True): (62_184, 167), ("fp8", True): (213_736, 574), ("none", False): (22_714, 61),
               ("fp8", False): (172_032, 462)}  # fmt: skip


@pytest.mark.parametrize(("quantization", "eager"), sorted(ENGINE_RUNS))
def test_each_engine_choice_is_sized_within_five_percent_of_vllm(quantization: str, eager: bool) -> None:
    tokens, blocks = ENGINE_RUNS[quantization, eager]
    sizing = size(QWEN, L4, dtype="bfloat16", tensor_parallel_size=1, gpu_memory_utilization=0.9, max_model_len=4096,
                  quantization=quantization, enforce_eager=eager, max_num_seqs=16)  # fmt: skip
    assert sizing.kv_capacity_tokens == pytest.approx(tokens, rel=0.05)
    assert sizing.num_blocks == pytest.approx(blocks, rel=0.05)


def test_fp8_weights_follow_the_models_linear_layers() -> None:
    # 6.92 B parameters in Linear layers at one byte, the other 2.10 B (embeddings, LM head, norms)
    # at two: 10.36 GiB against the 10.39 GiB vLLM loaded.
    assert QWEN.linear_params == 6_918_504_448
    fp8 = size(QWEN, L4, dtype="bfloat16", tensor_parallel_size=1, gpu_memory_utilization=0.9, max_model_len=4096,
               quantization="fp8")  # fmt: skip
    assert fp8.weight_bytes / GIB == pytest.approx(10.39, rel=0.01)


def test_cuda_graphs_refuse_more_sequences_than_mamba_blocks() -> None:
    with pytest.raises(ConfigError, match=r"^decode_max_num_seqs=60 with decode_enforce_eager=false: .* holds \d+ .*"
                                          r"Fix: set decode_max_num_seqs to at most"):  # fmt: skip
        DeploymentConfig.create(decode_enforce_eager=False, decode_max_num_seqs=60)
    assert DeploymentConfig.create(decode_enforce_eager=False).sizing(Phase.DECODE).max_num_seqs == 6  # type: ignore[union-attr]


@pytest.mark.parametrize("quantization", ["none", "fp8"])
@pytest.mark.parametrize("eager", [True, False])
@pytest.mark.parametrize("seqs", [None, 1, 16, 48, 1024])
def test_every_engine_combination_is_built_or_refused_in_one_line(
    quantization: str, eager: bool, seqs: int | None
) -> None:
    settings = {"quantization": quantization, "prefill_enforce_eager": eager, "decode_enforce_eager": eager,
                "prefill_max_num_seqs": seqs, "decode_max_num_seqs": seqs}  # fmt: skip
    try:
        config = DeploymentConfig.create(**settings)
    except ConfigError as error:
        assert "\n" not in str(error) and "Fix:" in str(error)
        return
    sizing = config.sizing(Phase.DECODE)
    assert sizing is not None and not sizing.problems()
    assert sizing.max_num_seqs == (seqs or sizing.max_num_seqs) and sizing.max_num_seqs >= 1


def test_the_same_settings_are_refused_where_vllm_would_refuse_them() -> None:
    # 1,024 sequences: the profiling peak leaves less KV than one full-length sequence needs.
    with pytest.raises(ConfigError, match=r"one max_model_len=4096 sequence needs 11 KV blocks"):
        DeploymentConfig.create(decode_max_num_seqs=1024)
    with pytest.raises(ConfigError, match=r"decode_max_num_seqs=48 with decode_enforce_eager=false"):
        DeploymentConfig.create(decode_enforce_eager=False, decode_max_num_seqs=48)
    assert DeploymentConfig.create(quantization="fp8", decode_enforce_eager=False, decode_max_num_seqs=48)


def test_more_memory_fits_more() -> None:
    sizing = DeploymentConfig.create(gpu_instance_type="g6e.8xlarge").sizing(Phase.DECODE)
    assert sizing is not None and sizing.max_concurrent_sequences > 100
