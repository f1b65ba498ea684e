"""Will the model and its KV cache fit, and how many sequences of max_model_len can run at once?

Models what vLLM 0.26.0 allocates on each GPU, so that the synth gate refuses what vLLM would
refuse. Every figure is a product of model facts (catalog/), the dtype, the tensor-parallel
size and the GPU's memory, so a reviewer can redo it by hand (tests/unit/test_sizing.py does), and
tests/unit/test_sizing.py checks it against vLLM's own profiler log (../shared/gpu/kv-capacity-*.txt).

vLLM's rules, as its log states them:
- memory: KV cache = gpu_memory_utilization x GPU memory - weights - activation peak - non-torch
  memory (all measured by its profiling run);
- hybrid models (Gated DeltaNet + full attention): the attention block size is raised (in steps
  of 16 tokens) until an attention page is at least a Mamba page, then the Mamba page is padded
  to equal it; layers form KV-cache groups of equal size (the smaller layer count), and a request
  takes ceil(max_model_len / block size) blocks in each attention group plus one block in each
  linear-attention group. Dense models: 16-token blocks, one group of every layer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .catalog import InstanceFacts, ModelFacts

GIB = 1024**3
MIB = 1024**2
DTYPE_BYTES = {"auto": 2, "bfloat16": 2, "float16": 2, "float32": 4}
# Beside the torch allocator: NCCL, cuBLAS workspaces (vLLM's "non-torch forward increase",
# 0.23 GiB in the recorded runs).
NON_TORCH_BYTES = int(0.23 * GIB)
# Attention kernels want blocks in multiples of this many tokens.
BLOCK_ALIGNMENT_TOKENS = 16
DENSE_BLOCK_TOKENS = 16
# Weight formats (the ``quantization`` setting): "fp8" stores the Linear layers' weights in one
# byte each (vLLM's online FP8, from the bf16 checkpoint); the rest stays in the model's dtype.
QUANTIZATIONS = ("none", "fp8")
# The scheduler's token budget per step, pinned in the engine config (vLLM would pick it by GPU
# size: 2,048 below 70 GiB, 8,192 above); the activation peaks below were measured at it.
MAX_NUM_BATCHED_TOKENS = 2048
# Below this many concurrent max_model_len sequences per engine, synth warns.
USEFUL_CONCURRENCY = 4
# One TCP flow between EC2 instances is capped at 5 Gbps outside a placement group (10 inside);
# NIXL over UCX on TCP runs one flow per peer, so 5 Gbps is what a silent UCX fallback gets.
TCP_FLOW_GBPS = 5.0


@dataclass(frozen=True)
class EnginePeak:
    """What one engine mode takes beside weights and KV cache at ``PEAK_SEQS`` sequences, as vLLM
    0.26's profiler reported it."""

    activation_gib: float  # the torch activation peak of the profiling run
    cudagraph_gib: float  # CUDA graph memory (0 in eager mode)


# Measured: Qwen3.5-9B's shape, text only, max_num_batched_tokens 2,048, max_num_seqs 16, at an L4
# budget (docs/gpu-runs/2026-12-01/engine-choices/). torch.compile (CUDA graphs) raises the peak;
# FP8 weights lower the eager one.
PEAK_SEQS = 16
ENGINE_PEAKS = {
    ("none", True): EnginePeak(0.38, 0.0),
    ("fp8", True): EnginePeak(0.24, 0.0),
    ("none", False): EnginePeak(1.98, 0.09),
    ("fp8", False): EnginePeak(1.98, 0.05),
}
# The profiling run samples max_num_seqs sequences over the whole vocabulary: the peak grows with
# it (eager bf16: 0.38 GiB at 16, 1.00 GiB at vLLM's default 256; docs/gpu-runs/2026-11-30, 12-01).
# Assumed the same per sequence in every mode, and CUDA graph memory proportional to max_num_seqs
# (its capture sizes): estimates beyond the measured 16.
PEAK_GIB_PER_SEQ = (1.00 - 0.38) / (256 - 16)
REFERENCE_PEAK_GIB = 1.00  # the catalogue model's eager bf16 peak at 256 sequences


def activation_gib(model: ModelFacts, quantization: str, enforce_eager: bool, max_num_seqs: int) -> float:
    """Activation peak and CUDA graph memory of one engine, GiB (another model's scaled by its
    eager peak against the measured one's: an estimate)."""
    peak = ENGINE_PEAKS[(quantization, enforce_eager)]
    scale = model.activation_peak_gib / REFERENCE_PEAK_GIB
    activation = peak.activation_gib + PEAK_GIB_PER_SEQ * (max_num_seqs - PEAK_SEQS)
    return scale * activation + peak.cudagraph_gib * max_num_seqs / PEAK_SEQS


# vLLM 0.26's own max_num_seqs when none is given (an OpenAI server below 70 GiB).
VLLM_DEFAULT_MAX_NUM_SEQS = 256


@dataclass(frozen=True)
class Sizing:
    gpu_bytes: int
    usable_bytes: int
    weight_bytes: int
    activation_bytes: int  # profiling peak plus non-torch memory
    kv_bytes_per_token: int  # full-attention layers, all of them
    state_bytes_per_sequence: int  # linear-attention layers, all of them
    block_tokens: int
    page_bytes: int  # one layer's share of one block
    layers_per_group: int
    attention_groups: int
    linear_groups: int
    max_model_len: int
    network_gbps: float
    #: CUDA graphs (enforce_eager off): vLLM then needs a Mamba block per decode sequence.
    cuda_graphs: bool = False
    #: The engine's max_num_seqs (the setting, or the default ``size`` chose).
    max_num_seqs_setting: int | None = None

    @property
    def kv_budget_bytes(self) -> int:
        return self.usable_bytes - self.weight_bytes - self.activation_bytes

    @property
    def block_bytes(self) -> int:
        return self.page_bytes * self.layers_per_group

    @property
    def num_blocks(self) -> int:
        return max(0, self.kv_budget_bytes // self.block_bytes)

    @property
    def blocks_per_sequence(self) -> int:
        return math.ceil(self.max_model_len / self.block_tokens) * self.attention_groups + self.linear_groups

    @property
    def concurrency(self) -> float:
        """vLLM's 'Maximum concurrency for <max_model_len> tokens per request'."""
        return self.num_blocks / self.blocks_per_sequence

    @property
    def kv_capacity_tokens(self) -> int:
        """vLLM's 'GPU KV cache size: N tokens' (concurrency x max_model_len)."""
        return int(self.concurrency * self.max_model_len)

    @property
    def max_concurrent_sequences(self) -> int:
        return math.floor(self.concurrency)

    @property
    def max_num_seqs(self) -> int:
        """The engine's ``max_num_seqs``: the setting, or the default ``size`` chose (what the KV
        cache holds at max_model_len, within the Mamba-block rule; 1 when not even one fits)."""
        return self.max_num_seqs_setting or 1

    @property
    def short_of_mamba_blocks(self) -> bool:
        """With CUDA graphs vLLM keeps a Mamba cache block per decode sequence: more sequences
        than blocks and it refuses to start."""
        return self.cuda_graphs and self.max_num_seqs > self.num_blocks

    @property
    def bytes_per_full_sequence(self) -> int:
        """What NIXL moves for one max_model_len prompt: its blocks in every group."""
        return self.blocks_per_sequence * self.block_bytes

    def transfer_ms(self, gbps: float) -> float:
        return self.bytes_per_full_sequence * 8 / (gbps * 1e9) * 1e3

    def problems(self) -> list[str]:
        found = []
        if self.weight_bytes + self.activation_bytes > self.usable_bytes:
            found.append(
                f"the weights and activations need {(self.weight_bytes + self.activation_bytes) / GIB:.1f} GiB per "
                f"GPU but gpu_memory_utilization leaves {self.usable_bytes / GIB:.1f} GiB"
            )
        elif self.concurrency < 1:
            found.append(
                f"one max_model_len={self.max_model_len} sequence needs {self.blocks_per_sequence} KV blocks "
                f"({self.bytes_per_full_sequence / MIB:.0f} MiB) per GPU but only {self.num_blocks} fit in the "
                f"{max(self.kv_budget_bytes, 0) / MIB:.0f} MiB left after weights and activations "
                f"(vLLM refuses to start)"
            )
        elif self.short_of_mamba_blocks:
            found.append(
                f"max_num_seqs={self.max_num_seqs} exceeds the {self.num_blocks} Mamba cache blocks the KV cache "
                "holds, and with CUDA graphs each decode sequence needs one (vLLM refuses to start)"
            )
        return found

    def warnings(self) -> list[str]:
        if self.problems() or self.concurrency >= USEFUL_CONCURRENCY:
            return []
        return [
            f"only {self.concurrency:.2f} sequences of max_model_len={self.max_model_len} fit the KV cache at "
            f"once (vLLM's figure); below {USEFUL_CONCURRENCY} requests queue behind each other"
        ]

    def summary(self) -> list[str]:
        return [
            f"GPU memory {self.gpu_bytes / GIB:.2f} GiB, usable {self.usable_bytes / GIB:.2f} GiB; "
            f"weights {self.weight_bytes / GIB:.2f} GiB; activations {self.activation_bytes / GIB:.2f} GiB; "
            f"KV cache {self.kv_budget_bytes / GIB:.2f} GiB",
            f"KV {self.kv_bytes_per_token / 1024:.0f} KiB/token (full-attention layers), linear-attention state "
            f"{self.state_bytes_per_sequence / MIB:.1f} MiB/sequence; blocks of {self.block_tokens} tokens, "
            f"{self.block_bytes / MIB:.2f} MiB each, {self.blocks_per_sequence} per sequence",
            f"{self.num_blocks} blocks: capacity {self.kv_capacity_tokens} tokens; concurrency "
            f"{self.concurrency:.2f} sequences of {self.max_model_len} tokens; max_num_seqs {self.max_num_seqs}"
            + (" (CUDA graphs)" if self.cuda_graphs else " (eager)"),
            f"one {self.max_model_len}-token prompt's KV: {self.bytes_per_full_sequence / MIB:.1f} MiB, "
            f"{self.transfer_ms(self.network_gbps):.1f} ms over EFA at {self.network_gbps:g} Gbps vs "
            f"{self.transfer_ms(TCP_FLOW_GBPS):.1f} ms over one TCP flow at {TCP_FLOW_GBPS:g} Gbps",
        ]


def attention_bytes_per_token_per_layer(model: ModelFacts, dtype_bytes: int, tp: int) -> int:
    """K and V of one full-attention layer, heads split across tensor-parallel ranks."""
    return 2 * model.num_kv_heads * model.head_dim * dtype_bytes // tp


def kv_bytes_per_token(model: ModelFacts, dtype_bytes: int, tp: int) -> int:
    return model.full_attention_layers * attention_bytes_per_token_per_layer(model, dtype_bytes, tp)


def mamba_bytes_per_layer(model: ModelFacts, dtype_bytes: int, tp: int) -> int:
    """Gated DeltaNet, one layer: a convolution window (kernel - 1 positions of the q, k and v
    projections) in the model's dtype plus the recurrent state (value heads x key dim x value
    dim) in the model's ``mamba_ssm_dtype`` when its config names one (vLLM honours it)."""
    conv_dim = 2 * model.linear_num_key_heads * model.linear_key_head_dim
    conv_dim += model.linear_num_value_heads * model.linear_value_head_dim
    conv = max(model.linear_conv_kernel_dim - 1, 0) * conv_dim
    recurrent = model.linear_num_value_heads * model.linear_key_head_dim * model.linear_value_head_dim
    state_bytes = DTYPE_BYTES[model.mamba_ssm_dtype] if model.mamba_ssm_dtype else dtype_bytes
    return (conv * dtype_bytes + recurrent * state_bytes) // tp


def state_bytes_per_sequence(model: ModelFacts, dtype_bytes: int, tp: int) -> int:
    return model.linear_layers * mamba_bytes_per_layer(model, dtype_bytes, tp)


def _weight_bytes(model: ModelFacts, params: float, dtype_bytes: int, *, fp8: bool) -> int:
    """``params`` weights in ``dtype_bytes`` each, the Linear layers' and experts' in one with FP8."""
    if fp8:
        return int(model.linear_params + (params - model.linear_params) * dtype_bytes)
    return int(params * dtype_bytes)


def size(
    model: ModelFacts,
    instance: InstanceFacts,
    *,
    dtype: str,
    tensor_parallel_size: int,
    gpu_memory_utilization: float,
    max_model_len: int,
    multimodal: bool = False,
    gpu_bytes: int | None = None,
    quantization: str = "none",
    enforce_eager: bool = True,
    max_num_seqs: int | None = None,
) -> Sizing:
    """Per GPU, for one engine replica spread over ``tensor_parallel_size`` GPUs. ``gpu_bytes``
    overrides the instance's GPU memory (to compare with a run on another GPU)."""
    dtype_bytes = DTYPE_BYTES[dtype]
    tp = tensor_parallel_size
    gpu_bytes = instance.gpu_memory_mib * MIB if gpu_bytes is None else gpu_bytes
    params = model.params + (model.vision_params if multimodal else 0)
    # An FP8 checkpoint is stored as online FP8 would store it: the same bytes and engine peaks.
    quantization = "fp8" if model.checkpoint_quantization == "fp8" else quantization
    weight_bytes = _weight_bytes(model, params, dtype_bytes, fp8=quantization == "fp8") // tp
    # Profiling the vision encoder (one maximum-size video) peaks on its own, whatever max_num_seqs:
    # 1.92 GiB at 15 sequences as at 256 (docs/gpu-runs/2026-12-03/emulate-default-template), so the
    # engine's peak is the larger of the two profiling runs, not their sum.
    encoder = model.activation_peak_gib + model.encoder_profile_peak_gib if multimodal else 0.0
    per_token_layer = attention_bytes_per_token_per_layer(model, dtype_bytes, tp)
    if model.hybrid:
        mamba_page = mamba_bytes_per_layer(model, dtype_bytes, tp)
        step = BLOCK_ALIGNMENT_TOKENS
        block_tokens = step * math.ceil(mamba_page / (step * per_token_layer))
        group = min(model.full_attention_layers, model.linear_layers)
        attention_groups = math.ceil(model.full_attention_layers / group)
        linear_groups = math.ceil(model.linear_layers / group)
    else:
        block_tokens, group, attention_groups, linear_groups = DENSE_BLOCK_TOKENS, model.num_layers, 1, 0

    def sized(seqs: int, setting: int | None) -> Sizing:
        activation = max(activation_gib(model, quantization, enforce_eager, seqs), encoder)
        return Sizing(
            gpu_bytes=gpu_bytes,
            usable_bytes=int(gpu_bytes * gpu_memory_utilization),
            weight_bytes=weight_bytes,
            activation_bytes=int(activation * GIB) + NON_TORCH_BYTES,
            kv_bytes_per_token=kv_bytes_per_token(model, dtype_bytes, tp),
            state_bytes_per_sequence=state_bytes_per_sequence(model, dtype_bytes, tp),
            block_tokens=block_tokens,
            page_bytes=block_tokens * per_token_layer,
            layers_per_group=group,
            attention_groups=attention_groups,
            linear_groups=linear_groups,
            max_model_len=max_model_len,
            network_gbps=instance.network_gbps,
            cuda_graphs=not enforce_eager,
            max_num_seqs_setting=setting,
        )

    if max_num_seqs is not None:
        return sized(max_num_seqs, max_num_seqs)

    # The default: the most sequences s such that s full-length sequences fit the KV cache left
    # when vLLM profiles with s (fewer sequences, a lower peak, more KV), and no more than the
    # blocks when CUDA graphs need one each. The fit only gets worse as s grows: bisect.
    def fits(seqs: int) -> bool:
        trial = sized(seqs, seqs)
        return trial.concurrency >= seqs and not trial.short_of_mamba_blocks

    low, high = 1, VLLM_DEFAULT_MAX_NUM_SEQS
    if not fits(low):
        return sized(low, None)
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return sized(low, low)


# --- disk: what a GPU node's root volume holds --------------------------------------------------

# The serving image on a node: containerd keeps the pulled (compressed) layers beside the
# unpacked snapshot. An estimate from comparable vLLM CUDA images (25-29 GB unpacked, about half
# that compressed), not a measurement of ours: no node here pulls the image.
IMAGE_DISK_GIB = 40
# The node's other images (VPC CNI, device plugins, CloudWatch agents) and Ray's logs under
# /tmp/ray in the container: an allowance, not a measurement.
NODE_OTHER_GIB = 10
# kubelet's default hard eviction threshold: nodefs.available < 10%.
EVICTION_FREE_FRACTION = 0.10
# The checkpoints in the catalogue are stored in bf16 (2 bytes a weight) unless FP8.
CHECKPOINT_DTYPE_BYTES = 2


def checkpoint_bytes(model: ModelFacts) -> int:
    """The checkpoint's files as the mirror writes them under the container's model cache: every
    weight, the vision tower included (it is in the checkpoint whether or not it is loaded)."""
    params = model.params + model.vision_params
    return _weight_bytes(model, params, CHECKPOINT_DTYPE_BYTES, fp8=model.checkpoint_quantization == "fp8")


def largest_checkpoint_bytes(models: Sequence[ModelFacts | None]) -> int | None:
    """The largest of the served models' checkpoints (what bounds a rollout or a node's return:
    every model's engines read at once); None when there is none or one's size is unknown (a model
    the catalogue does not size)."""
    if not models or any(m is None for m in models):
        return None
    return max(checkpoint_bytes(m) for m in models if m is not None)


def root_volume_needed_gib(model: ModelFacts, copies: int = 1) -> int:
    """Root volume (GiB) for the image and ``copies`` checkpoints with kubelet's eviction margin
    still free. Two copies: a ``model_revision`` change restarts the engines in their pods, which
    download the new revision beside the old one."""
    used = IMAGE_DISK_GIB + NODE_OTHER_GIB + copies * checkpoint_bytes(model) / GIB
    return math.ceil(used / (1 - EVICTION_FREE_FRACTION))
