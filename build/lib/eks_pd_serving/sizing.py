"""Will the model and its KV cache fit, and how long does the KV take to move?

A first-order estimate, in bytes, of what vLLM allocates on each GPU; every figure is a product
of model facts (catalog.py), the dtype, the tensor-parallel size and the instance's GPU memory,
so a reviewer can redo it by hand (tests/test_sizing.py does).
"""

from __future__ import annotations

from dataclasses import dataclass

from .catalog import InstanceFacts, ModelFacts

GIB = 1024**3
MIB = 1024**2
DTYPE_BYTES = {"auto": 2, "bfloat16": 2, "float16": 2, "float32": 4}
# Activations, sampler and allocator slack that vLLM's profiling run claims beside weights
# and KV cache (enforce_eager: no CUDA graphs). An estimate, kept deliberately round.
ACTIVATION_RESERVE_BYTES = 1 * GIB
# One TCP flow between EC2 instances is capped at 5 Gbps outside a placement group (10 inside);
# NIXL over UCX on TCP runs one flow per peer, so 5 Gbps is what a silent UCX fallback gets.
TCP_FLOW_GBPS = 5.0


@dataclass(frozen=True)
class Sizing:
    gpu_bytes: int
    usable_bytes: int
    weight_bytes: int
    kv_bytes_per_token: int
    state_bytes_per_sequence: int
    kv_budget_bytes: int
    max_model_len: int
    network_gbps: float

    @property
    def kv_capacity_tokens(self) -> int:
        return max(0, self.kv_budget_bytes // self.kv_bytes_per_token) if self.kv_bytes_per_token else 0

    @property
    def bytes_per_full_sequence(self) -> int:
        return self.max_model_len * self.kv_bytes_per_token + self.state_bytes_per_sequence

    @property
    def max_concurrent_sequences(self) -> int:
        return max(0, self.kv_budget_bytes // self.bytes_per_full_sequence)

    def transfer_ms(self, gbps: float) -> float:
        """Time to move one max_model_len prompt's KV (and linear state) at ``gbps``."""
        return self.bytes_per_full_sequence * 8 / (gbps * 1e9) * 1e3

    def problems(self) -> list[str]:
        found = []
        if self.weight_bytes > self.usable_bytes:
            found.append(
                f"the weights need {self.weight_bytes / GIB:.1f} GiB per GPU but "
                f"gpu_memory_utilization leaves {self.usable_bytes / GIB:.1f} GiB"
            )
        elif self.max_concurrent_sequences < 1:
            found.append(
                f"one max_model_len={self.max_model_len} sequence needs "
                f"{self.bytes_per_full_sequence / MIB:.0f} MiB of KV cache per GPU but only "
                f"{max(self.kv_budget_bytes, 0) / MIB:.0f} MiB is left after the weights "
                f"(capacity {self.kv_capacity_tokens} tokens)"
            )
        return found

    def summary(self) -> list[str]:
        return [
            f"GPU memory {self.gpu_bytes / GIB:.2f} GiB, usable {self.usable_bytes / GIB:.2f} GiB; "
            f"weights {self.weight_bytes / GIB:.2f} GiB; KV budget {self.kv_budget_bytes / GIB:.2f} GiB "
            f"(after a {ACTIVATION_RESERVE_BYTES / GIB:.0f} GiB activation reserve)",
            f"KV {self.kv_bytes_per_token / 1024:.0f} KiB/token (full-attention layers only), linear-attention "
            f"state {self.state_bytes_per_sequence / MIB:.1f} MiB/sequence",
            f"capacity {self.kv_capacity_tokens} tokens; {self.max_concurrent_sequences} concurrent sequences "
            f"of {self.max_model_len} tokens",
            f"one {self.max_model_len}-token prompt's KV: {self.bytes_per_full_sequence / MIB:.1f} MiB, "
            f"{self.transfer_ms(self.network_gbps):.1f} ms over EFA at {self.network_gbps:g} Gbps vs "
            f"{self.transfer_ms(TCP_FLOW_GBPS):.1f} ms over one TCP flow at {TCP_FLOW_GBPS:g} Gbps",
        ]


def kv_bytes_per_token(model: ModelFacts, dtype_bytes: int, tp: int) -> int:
    """K and V of every full-attention layer, heads split across tensor-parallel ranks."""
    return 2 * model.full_attention_layers * model.num_kv_heads * model.head_dim * dtype_bytes // tp


def state_bytes_per_sequence(model: ModelFacts, dtype_bytes: int, tp: int) -> int:
    """Gated DeltaNet: a recurrent state (value heads x key dim x value dim) plus a convolution
    window (kernel - 1 positions of the q, k and v projections), per linear layer."""
    recurrent = model.linear_num_value_heads * model.linear_key_head_dim * model.linear_value_head_dim
    conv_dim = 2 * model.linear_num_key_heads * model.linear_key_head_dim
    conv_dim += model.linear_num_value_heads * model.linear_value_head_dim
    conv = max(model.linear_conv_kernel_dim - 1, 0) * conv_dim
    return model.linear_layers * (recurrent + conv) * dtype_bytes // tp


def size(
    model: ModelFacts,
    instance: InstanceFacts,
    *,
    dtype: str,
    tensor_parallel_size: int,
    gpu_memory_utilization: float,
    max_model_len: int,
) -> Sizing:
    """Per GPU, for one engine replica spread over ``tensor_parallel_size`` GPUs."""
    dtype_bytes = DTYPE_BYTES[dtype]
    gpu_bytes = instance.gpu_memory_mib * MIB
    usable = int(gpu_bytes * gpu_memory_utilization)
    weights = int(model.params * dtype_bytes) // tensor_parallel_size
    return Sizing(
        gpu_bytes=gpu_bytes,
        usable_bytes=usable,
        weight_bytes=weights,
        kv_bytes_per_token=kv_bytes_per_token(model, dtype_bytes, tensor_parallel_size),
        state_bytes_per_sequence=state_bytes_per_sequence(model, dtype_bytes, tensor_parallel_size),
        kv_budget_bytes=usable - weights - ACTIVATION_RESERVE_BYTES,
        max_model_len=max_model_len,
        network_gbps=instance.network_gbps,
    )
