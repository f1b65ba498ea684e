"""Qwen3.5 checkpoints for the GPU rehearsal, built offline: vLLM's own Qwen3.5 model class.

Two shapes of ``Qwen3_5ForConditionalGeneration`` (what vLLM 0.26.0 loads a Qwen3.5 checkpoint
as; it registers no text-only Qwen3.5 causal LM):

- ``tiny``: the 9B's layer pattern and head dimensions at toy width, random weights written here
  (seeded, so every engine loads the same numbers and PD and colocated outputs can be compared).
- ``full``: the 9B's shape; config and tokenizer only, served with ``load_format: dummy`` (vLLM
  fills the weights), for memory and speed figures.
- ``full-weights``: the 9B's shape with seeded random weights written as safetensors (about
  19 GB), for timing how a real checkpoint loads.

Both carry the 9B's ``mamba_ssm_dtype: float32`` (the Qwen3.5 family ships it; vLLM 0.26 then
keeps the Gated DeltaNet state in float32, which doubles the Mamba page and so the attention
block size). The tokenizer is the toy one from tiny_checkpoint.py plus Qwen's vision tokens.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from . import tiny_checkpoint

SHAPES = ("tiny", "full", "full-weights")
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]

# Qwen3.5-9B's text model (transformers' Qwen3_5TextConfig defaults are this model; rope and
# context as the published checkpoint states them).
FULL_TEXT: dict[str, Any] = {
    "model_type": "qwen3_5_text",
    "vocab_size": 248320,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 32,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 8,
    "full_attention_interval": 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "attn_output_gate": True,
    "attention_bias": False,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "mamba_ssm_dtype": "float32",
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 262144,
    "tie_word_embeddings": False,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000000,
        "partial_rotary_factor": 0.25,
        "mrope_interleaved": True,
        "mrope_section": [11, 11, 10],
    },
    "dtype": "bfloat16",
}
FULL_VISION: dict[str, Any] = {
    "model_type": "qwen3_5_vision",
    "depth": 27,
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_heads": 16,
    "in_channels": 3,
    "patch_size": 16,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "num_position_embeddings": 2304,
    "out_hidden_size": 4096,
    "hidden_act": "gelu_pytorch_tanh",
}
# Toy width, the 9B's head dimensions and layer pattern (3 Gated DeltaNet + 1 full attention).
TINY_TEXT = {
    **FULL_TEXT,
    "vocab_size": tiny_checkpoint.VOCAB_SIZE + 64,  # room for the vision tokens added to the toy BPE
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "layer_types": FULL_TEXT["layer_types"][:4],
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "max_position_embeddings": 4096,
}
TINY_VISION = {**FULL_VISION, "depth": 1, "hidden_size": 64, "intermediate_size": 128, "num_heads": 2,
               "out_hidden_size": 256}  # fmt: skip
# Qwen3.5's image and video processors (classes chosen by model_type); vLLM profiles the vision
# encoder with the largest video these allow when the vision tower is on.
IMAGE_PROCESSOR = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5] * 3,
                   "image_std": [0.5] * 3, "size": {"shortest_edge": 65536, "longest_edge": 16777216}}  # fmt: skip
VIDEO_PROCESSOR = {**IMAGE_PROCESSOR, "size": {"shortest_edge": 4096, "longest_edge": 25165824}, "fps": 2,
                   "min_frames": 4, "max_frames": 768}  # fmt: skip


def model_config(shape: str, token_ids: dict[str, int]) -> dict[str, Any]:
    """The checkpoint's config.json: text and vision config for ``shape``, the tokenizer's ids."""
    if shape not in SHAPES:
        raise ValueError(f"model shape {shape!r}: use one of {', '.join(SHAPES)}")
    text, vision = (TINY_TEXT, TINY_VISION) if shape == "tiny" else (FULL_TEXT, FULL_VISION)  # full, full-weights
    text = copy.deepcopy(text)
    text.update(eos_token_id=token_ids["<|im_end|>"], pad_token_id=token_ids["<|endoftext|>"])
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text,
        "vision_config": copy.deepcopy(vision),
        "vision_start_token_id": token_ids["<|vision_start|>"],
        "vision_end_token_id": token_ids["<|vision_end|>"],
        "image_token_id": token_ids["<|image_pad|>"],
        "video_token_id": token_ids["<|video_pad|>"],
        "tie_word_embeddings": False,
    }


def _tokenizer(out: Path) -> dict[str, int]:
    from transformers import AutoTokenizer

    tiny_checkpoint.build_tokenizer(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    tokenizer.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    tokenizer.save_pretrained(out)
    names = [*tiny_checkpoint.SPECIAL_TOKENS, *VISION_TOKENS]
    return {name: int(tokenizer.convert_tokens_to_ids(name)) for name in names}


def build(out: Path, shape: str, seed: int = 0) -> Path:
    """Write ``shape``'s checkpoint into ``out`` (idempotent). ``tiny`` and ``full-weights`` get
    seeded random weights; ``full`` none (serve it with ``load_format: dummy``)."""
    if (out / "config.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    config = model_config(shape, _tokenizer(out))
    (out / "preprocessor_config.json").write_text(json.dumps(IMAGE_PROCESSOR, indent=2))
    (out / "video_preprocessor_config.json").write_text(json.dumps(VIDEO_PROCESSOR, indent=2))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": config["text_config"]["eos_token_id"]}))
    if shape in ("tiny", "full-weights"):
        import torch
        from transformers import AutoConfig, AutoModelForImageTextToText

        (out / "config.json.tmp").write_text(json.dumps(config, indent=2))
        hf_config = AutoConfig.for_model(**config)
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(hf_config, dtype=torch.bfloat16)
        model.save_pretrained(out)
        (out / "config.json.tmp").unlink()
    # config.json last: its presence means the checkpoint is complete.
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


if __name__ == "__main__":
    import sys

    print(build(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "tiny"))
