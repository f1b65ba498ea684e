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

from rich.table import Table

from ..catalog import GPU_MEMORY_BANDWIDTH_GBPS, ModelFacts, facts_from_config
from ..config import DeploymentConfig
from ..engine_choices import engine_choices
from ..phase import PHASES, Phase
from ..sizing import GIB, Sizing
from ._common import add_config_arguments, console, load_config, table
from .cost import PRICES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.add_argument("--config-json", type=Path, help="a Hugging Face config.json instead of the catalog entry")


def facts_from_config_json(path: Path) -> ModelFacts:
    """Model facts from a config.json (see ``catalog.facts_from_config``)."""
    return facts_from_config(json.loads(path.read_text()))


def run(args: argparse.Namespace) -> int:
    config = load_config(args)
    facts = facts_from_config_json(args.config_json) if args.config_json else config.model_facts
    if facts is None:
        console.print(f"{config.model_source} is not in the model catalog. Fix: pass --config-json <its config.json>")
        return 2
    ok = True
    for phase in PHASES:
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
    console.print(what_if(config, facts))
    for line in cold_start(config, facts):
        console.print(line)
    for choice in config.models[1:]:  # served_models: each model's engines sized for its own checkpoint
        further = config.facts_of(choice)
        assert further is not None  # the settings' rules refuse a model outside the catalogue
        for phase in PHASES:
            sized = config.sizing(phase, further)
            assert sized is not None
            console.print(f"[bold]{phase}[/bold]: {choice.model_id} ({choice.repository}), per GPU")
            for line in sized.summary():
                console.print(f"  {line}")
    return 0 if ok else 1


# NAT gateway data processing, $/GB (cost's us-east-1 table); the S3 gateway endpoint has no data charge.
NAT_PER_GB = PRICES["us-east-1"]["nat_gb"]
# Measured (docs/gpu-runs/2026-12-01/weights-loading/): the 9B's 16.8 GiB of text weights from a
# local disk, page cache dropped, one H200 host: vLLM's default loader 12.7 s, the Run:ai streamer
# 11.8 s (1.6 GiB/s). Download time from S3 or Hugging Face was not measured here.
LOCAL_LOAD_GIB_PER_S = 16.8 / 12.7


def cold_start(config: DeploymentConfig, facts: ModelFacts) -> list[str]:
    """What one engine start moves and costs before it serves: the checkpoint's bytes, the NAT's
    charge for them (weights_source=huggingface) or none (s3, through the gateway endpoint), and
    the local load at the measured rate (an estimate for other models)."""
    size_gb = (
        2 * facts.params / 1e9
        if facts.checkpoint_quantization != "fp8"
        else ((facts.linear_params + 2 * (facts.params - facts.linear_params)) / 1e9)
    )
    nat = size_gb * NAT_PER_GB
    where = (
        f"from the stack's bucket through the S3 gateway endpoint: no NAT bytes (was {size_gb:.1f} GB, "
        f"${nat:.2f}, through the NAT from Hugging Face); staged once per revision by a job outside the VPC"
        if config.weights_source == "s3"
        else f"from Hugging Face through the NAT: {size_gb:.1f} GB, ${nat:.2f} of NAT processing per start"
    )
    load = size_gb * 1e9 / 1024**3 / LOCAL_LOAD_GIB_PER_S
    return [
        f"[bold]cold start[/bold], per engine start: the checkpoint is {size_gb:.1f} GB; {where}",
        f"  then vLLM loads it from the node's disk in about {load:.0f} s (measured 12.7 s for Qwen3.5-9B; "
        "scaled by size, an estimate); the image pull and the engine's own start come on top",
    ]


def what_if(config: DeploymentConfig, facts: ModelFacts) -> Table:
    """Decode's figures for each weight format and graph mode on its GPU, the configured one
    marked; the step-time floor is an estimate (bytes read per step over the memory bandwidth)."""
    group = config.gpu_group(Phase.DECODE)
    bandwidth = GPU_MEMORY_BANDWIDTH_GBPS.get(group.instance.gpu_name)
    rows = []
    for label, chosen, sizing in engine_choices(config, facts):
        floors = ["-", "-", "-"]
        if bandwidth and not sizing.problems():
            one, full = (step_floor_ms(sizing, batch, bandwidth) for batch in (1, sizing.max_num_seqs))
            floors = [f"{one:.0f}", f"{full:.0f}", f"{sizing.max_num_seqs * 1e3 / full:,.0f}"]
        rows.append([
            ("* " if chosen else "") + label,
            f"{sizing.weight_bytes / GIB:.2f}", f"{max(sizing.kv_budget_bytes, 0) / GIB:.2f}",
            f"{sizing.kv_capacity_tokens:,}", str(sizing.max_num_seqs), f"{sizing.concurrency:.2f}", *floors,
        ])  # fmt: skip
    return table(
        f"What the engine choices give: decode on {group.instance_type} ({group.instance.gpu_name}, "
        f"{bandwidth or '?'} GB/s); * = configured; step floor = weights + the batch's KV read once "
        "per step over the bandwidth, an estimate (vLLM's own steps are slower)",
        ["weights, mode", "weights GiB", "KV GiB", "KV tokens", "max_num_seqs", "full-length seqs",
         "step floor ms, batch 1", "step floor ms, max_num_seqs", "tokens/s ceiling, max_num_seqs"],
        rows,
    )  # fmt: skip


def step_floor_ms(sizing: Sizing, batch: int, bandwidth_gbps: float) -> float:
    """A decode step reads every weight once and each running sequence's KV (at full length: the
    most it reads); nothing can run faster than those bytes over the memory bandwidth."""
    read = sizing.weight_bytes + batch * sizing.bytes_per_full_sequence
    return read / (bandwidth_gbps * 1e9) * 1e3
