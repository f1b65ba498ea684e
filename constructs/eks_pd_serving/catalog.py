"""Facts about instance types and models that synth needs offline.

Instance figures are those EC2 ``DescribeInstanceTypes`` reports (GPU memory in MiB as EC2
reports it, not the marketed size). A type missing here is rejected with the list of known
ones; adding a row is the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final


@dataclass(frozen=True)
class InstanceFacts:
    vcpus: int
    memory_gib: int
    gpus: int = 0
    gpu_name: str = ""
    gpu_memory_mib: int = 0
    efa_interfaces: int = 0
    network_gbps: float = 0.0

    @property
    def efa_supported(self) -> bool:
        return self.efa_interfaces > 0


def _l4(vcpus: int, memory_gib: int, gpus: int, efa: int, gbps: float) -> InstanceFacts:
    return InstanceFacts(vcpus, memory_gib, gpus, "L4", 22888, efa, gbps)


def _l40s(vcpus: int, memory_gib: int, gpus: int, efa: int, gbps: float) -> InstanceFacts:
    return InstanceFacts(vcpus, memory_gib, gpus, "L40S", 45776, efa, gbps)


INSTANCE_TYPES: Final[dict[str, InstanceFacts]] = {
    # General purpose, for the system node group (KubeRay operator, Ray head).
    "m7i.large": InstanceFacts(2, 8),
    "m7i.xlarge": InstanceFacts(4, 16),
    "m7i.2xlarge": InstanceFacts(8, 32),
    "m7i.4xlarge": InstanceFacts(16, 64),
    "m6i.xlarge": InstanceFacts(4, 16),
    "m6i.2xlarge": InstanceFacts(8, 32),
    "m5.xlarge": InstanceFacts(4, 16),
    "m5.2xlarge": InstanceFacts(8, 32),
    # NVIDIA L4.
    "g6.xlarge": _l4(4, 16, 1, 0, 10),
    "g6.2xlarge": _l4(8, 32, 1, 0, 10),
    "g6.4xlarge": _l4(16, 64, 1, 0, 25),
    "g6.8xlarge": _l4(32, 128, 1, 1, 25),
    "g6.12xlarge": _l4(48, 192, 4, 1, 40),
    "g6.16xlarge": _l4(64, 256, 1, 1, 25),
    "g6.24xlarge": _l4(96, 384, 4, 1, 50),
    "g6.48xlarge": _l4(192, 768, 8, 1, 100),
    # NVIDIA L40S.
    "g6e.xlarge": _l40s(4, 32, 1, 0, 20),
    "g6e.8xlarge": _l40s(32, 256, 1, 1, 25),
    "g6e.12xlarge": _l40s(48, 384, 4, 1, 100),
    "g6e.24xlarge": _l40s(96, 768, 4, 2, 200),
    "g6e.48xlarge": _l40s(192, 1536, 8, 4, 400),
}


@dataclass(frozen=True)
class ModelFacts:
    """What sizing and validation need to know about a model without downloading it.

    Figures come from the model's ``config.json`` (text model). Linear-attention (Gated
    DeltaNet) layers keep a fixed per-sequence state instead of per-token KV.
    """

    params: float  # parameters, as counted for the weights in memory
    max_model_len: int  # max_position_embeddings
    num_layers: int
    full_attention_layers: int
    num_kv_heads: int
    head_dim: int
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    # The Gated DeltaNet state's dtype when config.json names one (``mamba_ssm_dtype``); vLLM
    # 0.26 keeps the state in it, else in the model's dtype.
    mamba_ssm_dtype: str | None = None
    # Measured by vLLM's profiling run (enforce_eager, max_num_batched_tokens 2048): the torch
    # activation peak of the text model, and what profiling the vision encoder adds.
    activation_peak_gib: float = 1.0
    vision_params: float = 0.0  # the vision tower, loaded unless language_model_only
    encoder_profile_peak_gib: float = 0.0
    # Shapes of the text model's linear layers (config.json): what online FP8 quantizes.
    hidden_size: int = 0
    intermediate_size: int = 0
    num_attention_heads: int = 0
    attn_output_gate: bool = False  # the query projection also yields a gate (twice its width)

    @property
    def linear_params(self) -> int:
        """Weights of the text model's Linear layers, the ones vLLM's online ``quantization: fp8``
        stores in FP8 (attention and Gated DeltaNet projections, the MLPs); embeddings, the LM head,
        norms and the vision tower stay in the model's dtype."""
        h = self.hidden_size
        mlp = 3 * h * self.intermediate_size  # gate and up, down
        q = self.num_attention_heads * self.head_dim * (2 if self.attn_output_gate else 1)
        attention = h * q + 2 * h * self.num_kv_heads * self.head_dim + self.num_attention_heads * self.head_dim * h
        key_dim = self.linear_num_key_heads * self.linear_key_head_dim
        value_dim = self.linear_num_value_heads * self.linear_value_head_dim
        # in_proj_qkvz (q, k, v and the gate z), in_proj_ba (one beta and one alpha per value head), out_proj
        deltanet = h * (2 * key_dim + 2 * value_dim) + h * 2 * self.linear_num_value_heads + value_dim * h
        return self.num_layers * mlp + self.full_attention_layers * attention + self.linear_layers * deltanet

    @property
    def linear_layers(self) -> int:
        return self.num_layers - self.full_attention_layers

    @property
    def hybrid(self) -> bool:
        """Hybrid models need the same tensor-parallel size on prefill and decode and
        VLLM_SSM_CONV_STATE_LAYOUT=DS for NIXL transfers."""
        return self.linear_layers > 0


# The state dtypes a config.json may name for Gated DeltaNet layers (``mamba_ssm_dtype``).
_STATE_DTYPES = ("bfloat16", "float16", "float32")
# GPU memory bandwidth, GB/s, from NVIDIA's product datasheets (L4: 300 GB/s; L40S: 864 GB/s): the
# decode step-time floor of `sizing`'s what-if table.
GPU_MEMORY_BANDWIDTH_GBPS: Final = {"L4": 300.0, "L40S": 864.0}


# Keyed by Hugging Face model source.
MODELS: Final[dict[str, ModelFacts]] = {
    # 32 layers: 24 Gated DeltaNet + 8 full attention (full_attention_interval 4); ~18 GB bf16.
    # Weights and peaks as vLLM 0.26.0 measured them (../shared/gpu/kv-capacity-2026-11-30.txt):
    # text model 16.8 GiB (9.02e9 bf16 parameters), with the vision tower 17.66 GiB; activation
    # peak 1.0 GiB text-only, 1.92 GiB when it profiles the encoder with one maximum-size video.
    "Qwen/Qwen3.5-9B": ModelFacts(
        params=9.02e9,
        vision_params=0.4617e9,
        activation_peak_gib=1.0,
        encoder_profile_peak_gib=0.92,
        max_model_len=262144,
        num_layers=32,
        full_attention_layers=8,
        num_kv_heads=4,
        head_dim=256,
        linear_num_key_heads=16,
        linear_num_value_heads=32,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        mamba_ssm_dtype="float32",
        hidden_size=4096,
        intermediate_size=12288,
        num_attention_heads=16,
        attn_output_gate=True,
    ),
}

# CloudWatch Logs accepts only these retention periods, days (PutRetentionPolicy).
LOG_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922,
                      3288, 3653)  # fmt: skip


def facts_from_config(raw: Mapping[str, Any]) -> ModelFacts:
    """Model facts from a model's own config.json, parsed (multimodal wrappers keep the text model
    in text_config). Raises KeyError or ValueError when a field sizing needs is missing or wrong."""
    text = raw.get("text_config", raw)
    layers = int(text["num_hidden_layers"])
    types = text.get("layer_types") or ["full_attention"] * layers
    head_dim = int(text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"])
    vocab, hidden = int(text["vocab_size"]), int(text["hidden_size"])
    inter = int(text.get("intermediate_size", 4 * hidden))
    # Rough parameter count when the file does not say: embeddings, attention, MLP per layer.
    params = raw.get("num_parameters") or (2 * vocab * hidden + layers * (4 * hidden * hidden + 3 * hidden * inter))
    return ModelFacts(
        params=float(params),
        max_model_len=int(text.get("max_position_embeddings", 4096)),
        num_layers=layers,
        full_attention_layers=sum(t == "full_attention" for t in types),
        num_kv_heads=int(text.get("num_key_value_heads", text["num_attention_heads"])),
        head_dim=head_dim,
        linear_num_key_heads=int(text.get("linear_num_key_heads", 0)),
        linear_num_value_heads=int(text.get("linear_num_value_heads", 0)),
        linear_key_head_dim=int(text.get("linear_key_head_dim", 0)),
        linear_value_head_dim=int(text.get("linear_value_head_dim", 0)),
        linear_conv_kernel_dim=int(text.get("linear_conv_kernel_dim", 0)),
        mamba_ssm_dtype=text.get("mamba_ssm_dtype") if text.get("mamba_ssm_dtype") in _STATE_DTYPES else None,
        hidden_size=hidden,
        intermediate_size=inter,
        num_attention_heads=int(text["num_attention_heads"]),
        attn_output_gate=bool(text.get("attn_output_gate", False)),
    )
