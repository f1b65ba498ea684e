"""Sizing against figures worked out by hand for Qwen3.5-9B on one L4 (g6.8xlarge).

By hand:
  GPU memory     22,888 MiB (EC2 reports for the L4)         = 23,999,807,488 B
  usable x 0.90                                              = 21,599,826,739 B
  weights        9.0e9 params x 2 B (bf16)                    = 18,000,000,000 B
  KV budget      usable - weights - 1 GiB reserve            =  2,526,084,915 B
  KV per token   2 (K,V) x 8 full layers x 4 KV heads x 256 x 2 B = 32,768 B
  linear state   24 layers x (32 x 128 x 128 + 3 x (2 x 16 x 128 + 32 x 128)) x 2 B = 26,345,472 B
  capacity       2,526,084,915 // 32,768                      = 77,089 tokens
  one sequence   4,096 x 32,768 + 26,345,472                  = 160,563,200 B
  concurrent     2,526,084,915 // 160,563,200                 = 15
  transfer       160,563,200 x 8 / 25e9 s = 51.38 ms (EFA); / 5e9 s = 256.90 ms (one TCP flow)
"""

from __future__ import annotations

import pytest

from eks_pd_serving.catalog import INSTANCE_TYPES, MODELS
from eks_pd_serving.config import ConfigError, DeploymentConfig
from eks_pd_serving.sizing import size

QWEN = MODELS["Qwen/Qwen3.5-9B"]


def test_default_deployment_by_hand() -> None:
    sizing = DeploymentConfig().sizing("decode")
    assert sizing is not None
    assert sizing.gpu_bytes == 23_999_807_488
    assert sizing.usable_bytes == 21_599_826_739
    assert sizing.weight_bytes == 18_000_000_000
    assert sizing.kv_budget_bytes == 2_526_084_915
    assert sizing.kv_bytes_per_token == 32_768
    assert sizing.state_bytes_per_sequence == 26_345_472
    assert sizing.kv_capacity_tokens == 77_089
    assert sizing.bytes_per_full_sequence == 160_563_200
    assert sizing.max_concurrent_sequences == 15
    assert sizing.transfer_ms(25) == pytest.approx(51.38, abs=0.01)
    assert sizing.transfer_ms(5) == pytest.approx(256.90, abs=0.01)


def test_tensor_parallelism_splits_weights_and_kv() -> None:
    sizing = size(
        QWEN, INSTANCE_TYPES["g6.12xlarge"], dtype="bfloat16", tensor_parallel_size=2,
        gpu_memory_utilization=0.9, max_model_len=4096,
    )  # fmt: skip
    assert sizing.weight_bytes == 9_000_000_000
    assert sizing.kv_bytes_per_token == 16_384
    assert sizing.state_bytes_per_sequence == 13_172_736


def test_only_full_attention_layers_hold_per_token_kv() -> None:
    dense = QWEN.__class__(params=QWEN.params, max_model_len=4096, num_layers=32, full_attention_layers=32,
                           num_kv_heads=4, head_dim=256)  # fmt: skip
    sizing = size(dense, INSTANCE_TYPES["g6.8xlarge"], dtype="bfloat16", tensor_parallel_size=1,
                  gpu_memory_utilization=0.9, max_model_len=4096)  # fmt: skip
    assert sizing.kv_bytes_per_token == 4 * 32_768
    assert sizing.state_bytes_per_sequence == 0


def test_synth_rejects_a_context_the_kv_cache_cannot_hold() -> None:
    # 65,536 tokens: 65,536 x 32,768 + 26,345,472 = 2,173,812,736 B <= 2,526,084,915: fits once.
    assert DeploymentConfig.create(max_model_len=65_536).sizing("decode").max_concurrent_sequences == 1  # type: ignore[union-attr]
    # 131,072 tokens: 4,321,378,304 B > budget.
    with pytest.raises(
        ConfigError, match=r"^max_model_len=131072 .* needs 4121 MiB of KV cache per GPU but only 2409 MiB"
    ):
        DeploymentConfig.create(max_model_len=131_072)


def test_synth_rejects_weights_that_do_not_fit() -> None:
    with pytest.raises(
        ConfigError, match=r"the weights need 33.5 GiB per GPU but gpu_memory_utilization leaves 20.1 GiB"
    ):
        DeploymentConfig.create(dtype="float32")


def test_more_memory_fits_more() -> None:
    sizing = DeploymentConfig.create(gpu_instance_type="g6e.8xlarge").sizing("decode")
    assert sizing is not None and sizing.max_concurrent_sequences > 100
