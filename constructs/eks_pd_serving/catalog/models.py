"""Models synth can size without downloading them, and how a config.json becomes model facts.

Every entry comes from the model's own published ``config.json``; the copies in ``configs/`` are
verbatim, each named in ``CATALOG`` with where it was read. Qwen3.5-9B's figures are vLLM's own
measurements of its shape (``../shared/gpu/kv-capacity-2026-11-30.txt``), its config's fields as
rehearsal/qwen35_checkpoint.py writes them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

# Architecture classes: what sizing and the NIXL compatibility rules treat differently.
DENSE, MOE, HYBRID = "dense", "moe", "hybrid"


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
    # Measured by vLLM's profiling run (enforce_eager, max_num_batched_tokens 2048, 256 sequences):
    # the torch activation peak of the text model, and how far profiling the vision encoder
    # lifts it (that run's peak does not shrink with max_num_seqs: sizing takes the larger).
    activation_peak_gib: float = 1.0
    vision_params: float = 0.0  # the vision tower, loaded unless language_model_only
    encoder_profile_peak_gib: float = 0.0
    # Shapes of the text model's linear layers (config.json): what online FP8 quantizes.
    hidden_size: int = 0
    intermediate_size: int = 0
    num_attention_heads: int = 0
    attn_output_gate: bool = False  # the query projection also yields a gate (twice its width)
    # Mixture of experts: every expert's weights are in memory, a few run per token.
    num_experts: int = 0
    moe_intermediate_size: int = 0
    num_experts_per_tok: int = 0
    vocab_size: int = 0
    tie_word_embeddings: bool = False
    # The checkpoint's own weight format (config.json's quantization_config.quant_method): "fp8"
    # checkpoints store the Linear and expert weights in one byte each.
    checkpoint_quantization: str | None = None

    @property
    def architecture(self) -> str:
        """``hybrid`` (Gated DeltaNet + attention), ``moe`` or ``dense``: the class vLLM's NIXL
        compatibility matrix has rules for."""
        if self.linear_layers:
            return HYBRID
        return MOE if self.num_experts else DENSE

    @property
    def linear_params(self) -> int:
        """Weights of the text model's Linear layers and experts, the ones FP8 (vLLM's online
        ``quantization: fp8``, or an FP8 checkpoint) stores in one byte each (attention and Gated
        DeltaNet projections, the MLPs or experts); embeddings, the LM head, the MoE router, norms
        and the vision tower stay in the model's dtype."""
        h = self.hidden_size
        if self.num_experts:
            mlp = self.num_experts * 3 * h * self.moe_intermediate_size  # each expert: gate, up, down
        else:
            mlp = 3 * h * self.intermediate_size
        q = self.num_attention_heads * self.head_dim * (2 if self.attn_output_gate else 1)
        attention = h * q + 2 * h * self.num_kv_heads * self.head_dim + self.num_attention_heads * self.head_dim * h
        key_dim = self.linear_num_key_heads * self.linear_key_head_dim
        value_dim = self.linear_num_value_heads * self.linear_value_head_dim
        # in_proj_qkvz (q, k, v and the gate z), in_proj_ba (one beta and one alpha per value head), out_proj
        deltanet = h * (2 * key_dim + 2 * value_dim) + h * 2 * self.linear_num_value_heads + value_dim * h
        return self.num_layers * mlp + self.full_attention_layers * attention + self.linear_layers * deltanet

    @property
    def shape_params(self) -> int:
        """Every weight the shapes imply: the Linear layers and experts, the embeddings and LM head
        (one matrix when tied), the MoE router; norms are left out (under 0.01%)."""
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        router = self.num_layers * self.hidden_size * self.num_experts
        return self.linear_params + embeddings + router

    @property
    def checkpoint_gb(self) -> float:
        """The text model's checkpoint, GB: two bytes a weight, or one for the Linear and expert
        weights of an FP8 checkpoint (what staging copies and an engine start moves)."""
        if self.checkpoint_quantization == "fp8":
            return (self.linear_params + 2 * (self.params - self.linear_params)) / 1e9
        return 2 * self.params / 1e9

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
# Weight formats of published checkpoints sizing knows (quantization_config.quant_method).
CHECKPOINT_QUANTIZATIONS = ("fp8",)


def facts_from_config(raw: Mapping[str, Any]) -> ModelFacts:
    """Model facts from a model's own config.json, parsed (multimodal wrappers keep the text model
    in text_config). Raises KeyError or ValueError when a field sizing needs is missing or wrong,
    or the checkpoint's weight format is one sizing does not know."""
    text = raw.get("text_config", raw)
    layers = int(text["num_hidden_layers"])
    types = text.get("layer_types") or ["full_attention"] * layers
    head_dim = int(text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"])
    quantization = (raw.get("quantization_config") or text.get("quantization_config") or {}).get("quant_method")
    if quantization is not None and quantization not in CHECKPOINT_QUANTIZATIONS:
        raise ValueError(f"quantization_config.quant_method={quantization!r} is not one sizing knows (fp8)")
    sliding = [t for t in types if t not in ("full_attention", "linear_attention")]
    if sliding:
        raise ValueError(f"layer_types {sorted(set(sliding))} (sliding-window attention) are not sized yet")
    facts = ModelFacts(
        params=0.0,
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
        hidden_size=int(text["hidden_size"]),
        intermediate_size=int(text.get("intermediate_size", 4 * int(text["hidden_size"]))),
        num_attention_heads=int(text["num_attention_heads"]),
        attn_output_gate=bool(text.get("attn_output_gate", False)),
        num_experts=int(text.get("num_experts") or text.get("num_local_experts") or 0),
        moe_intermediate_size=int(text.get("moe_intermediate_size") or 0),
        num_experts_per_tok=int(text.get("num_experts_per_tok") or 0),
        vocab_size=int(text["vocab_size"]),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
        checkpoint_quantization=quantization,
    )
    if facts.num_experts and not facts.moe_intermediate_size:
        raise ValueError("num_experts is set but moe_intermediate_size is not")
    return replace(facts, params=float(raw.get("num_parameters") or facts.shape_params))


CONFIGS: Final = Path(__file__).parent / "configs"
# Where each vendored config.json was read: ai-dynamo/aiconfigurator keeps published Hugging Face
# configs verbatim (aic-core/src/aiconfigurator_core/model_configs/, commit 0b077da5e017).
_AICONFIGURATOR = "ai-dynamo/aiconfigurator@0b077da5e017 aic-core/src/aiconfigurator_core/model_configs/"


@dataclass(frozen=True)
class CatalogEntry:
    config: str  # file under configs/
    source: str  # where the copy was read
    # vLLM 0.26's measured eager activation peak at 2,048 batched tokens (GiB), where measured.
    activation_peak_gib: float = 1.0
    # The Hub serves the files only to an account that accepted the model's license (a token).
    gated: bool = False


CATALOG: Final[dict[str, CatalogEntry]] = {
    # Meta's base config; the Instruct model's differs only in eos_token_id (a list) and
    # transformers_version (the Instruct file, seen in a second copy).
    # Both gated: Meta's Llama 3.1 community license must be accepted on the Hub first.
    "meta-llama/Llama-3.1-8B-Instruct": CatalogEntry(
        "meta-llama--Meta-Llama-3.1-8B.json", _AICONFIGURATOR + "meta-llama--Meta-Llama-3.1-8B_config.json", gated=True
    ),
    "meta-llama/Llama-3.1-70B-Instruct": CatalogEntry(
        "meta-llama--Meta-Llama-3.1-70B.json",
        _AICONFIGURATOR + "meta-llama--Meta-Llama-3.1-70B_config.json",
        gated=True,
    ),
    "Qwen/Qwen3-8B": CatalogEntry("Qwen--Qwen3-8B.json", _AICONFIGURATOR + "Qwen--Qwen3-8B_config.json"),
    "Qwen/Qwen3-32B": CatalogEntry("Qwen--Qwen3-32B.json", _AICONFIGURATOR + "Qwen--Qwen3-32B_config.json"),
    "Qwen/Qwen3-30B-A3B": CatalogEntry("Qwen--Qwen3-30B-A3B.json", _AICONFIGURATOR + "Qwen--Qwen3-30B-A3B_config.json"),
    "Qwen/Qwen3-30B-A3B-FP8": CatalogEntry(
        "Qwen--Qwen3-30B-A3B-FP8.json", _AICONFIGURATOR + "Qwen--Qwen3-30B-A3B-FP8_config.json"
    ),
}


GATED: Final[frozenset[str]] = frozenset(source for source, entry in CATALOG.items() if entry.gated)


def _from_catalog(entry: CatalogEntry) -> ModelFacts:
    facts = facts_from_config(json.loads((CONFIGS / entry.config).read_text()))
    return replace(facts, activation_peak_gib=entry.activation_peak_gib)


# Keyed by Hugging Face model source.
MODELS: Final[dict[str, ModelFacts]] = {
    # 32 layers: 24 Gated DeltaNet + 8 full attention (full_attention_interval 4); ~18 GB bf16.
    # Weights and peaks as vLLM 0.26.0 measured them (../shared/gpu/kv-capacity-2026-11-30.txt):
    # text model 16.8 GiB (9.02e9 bf16 parameters), with the vision tower 17.66 GiB; activation
    # peak 1.0 GiB text-only, 1.92 GiB (printed to 0.01 GiB) when it profiles the encoder with one
    # maximum-size video. The encoder's share is taken from bytes, not from those rounded figures:
    # the two engines of one run at one budget (docs/gpu-runs/2026-12-03/emulate-default-template)
    # left KV memory 2,448.97 MiB apart (vLLM's own --kv-cache-memory figures, exact to the byte);
    # less the vision tower's weights (880.62 MiB) that is 1,568.34 MiB more peak and non-torch
    # memory than the text engine's 0.3774 GiB at 15 sequences: a multimodal peak of 1.909 GiB
    # (tests/unit/test_sizing.py derives it again from the logs).
    "Qwen/Qwen3.5-9B": ModelFacts(
        params=9.02e9,
        vision_params=0.4617e9,
        activation_peak_gib=1.0,
        encoder_profile_peak_gib=0.909,
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
        vocab_size=248320,
    ),
    **{source: _from_catalog(entry) for source, entry in CATALOG.items()},
}
