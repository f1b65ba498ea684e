"""Will the model and its KV cache fit on the GPU, and how fast does the KV move?

Per GPU, for each phase: weights, KV bytes per token (full-attention layers only), linear-
attention state per sequence, KV capacity, concurrent sequences at max_model_len, and the time
to move one max_model_len prompt's KV over EFA vs one TCP flow; then the phase's replicas (min to max
with autoscaling) and what they hold together. `cdk synth` prints the same and
rejects a deployment that does not fit. --config-json sizes a model from its own config.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..catalog import ModelFacts
from ..sizing import DTYPE_BYTES
from ._common import add_config_arguments, console, load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.add_argument("--config-json", type=Path, help="a Hugging Face config.json instead of the catalog entry")


def facts_from_config_json(path: Path) -> ModelFacts:
    """Model facts from a config.json (multimodal wrappers keep the text model in text_config)."""
    raw: dict[str, Any] = json.loads(path.read_text())
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
        mamba_ssm_dtype=text.get("mamba_ssm_dtype") if text.get("mamba_ssm_dtype") in DTYPE_BYTES else None,
    )


def run(args: argparse.Namespace) -> int:
    config = load_config(args)
    facts = facts_from_config_json(args.config_json) if args.config_json else config.model_facts
    if facts is None:
        console.print(f"{config.model_source} is not in the model catalog. Fix: pass --config-json <its config.json>")
        return 2
    ok = True
    for phase in ("prefill", "decode"):
        sizing = config.sizing(phase, facts)
        assert sizing is not None
        console.print(
            f"[bold]{phase}[/bold]: {config.model_source} on {config.gpu_group(phase).instance_type}, per GPU"
        )
        for line in sizing.summary():
            console.print(f"  {line}")
        low, high = config.replica_bounds(phase)
        console.print(
            f"  replicas {low} to {high}"
            + (" (autoscaling)" if config.autoscaling else " (fixed)")
            + f": {sizing.concurrency * low:.2f} to {sizing.concurrency * high:.2f} sequences of "
            f"{sizing.max_model_len} tokens in all"
        )
        for problem in sizing.problems():
            ok = False
            console.print(f"  [red]does not fit:[/red] {problem}")
    return 0 if ok else 1
