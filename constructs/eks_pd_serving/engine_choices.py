"""The engine choices for decode's GPU, each weight format with and without CUDA graphs: the
synth output's one line (``what_if_line``) and the sizing command's table (``engine_choices``)."""

from __future__ import annotations

from .catalog import ModelFacts
from .config import DeploymentConfig
from .phase import Phase
from .sizing import QUANTIZATIONS, Sizing


def engine_choices(config: DeploymentConfig, facts: ModelFacts) -> list[tuple[str, bool, Sizing]]:
    """(label, configured?, decode's sizing) for each weight format and graph mode on decode's GPU:
    the configured row is the synth gate's figures (``config.sizing``)."""
    found = []
    for quantization in QUANTIZATIONS:
        for eager in (True, False):
            sizing = config.sizing(Phase.DECODE, facts, quantization=quantization, enforce_eager=eager)
            assert sizing is not None  # facts given
            label = f"{'bf16' if quantization == 'none' else quantization}, {'eager' if eager else 'CUDA graphs'}"
            found.append((label, (quantization, eager) == (config.quantization, config.decode_enforce_eager), sizing))
    return found


def what_if_line(config: DeploymentConfig, facts: ModelFacts) -> str:
    """The what-if table in one line, for the synth output."""
    parts = [f"{'*' if chosen else ''}{label} {s.kv_capacity_tokens:,} ({s.max_num_seqs} seqs)"
             for label, chosen, s in engine_choices(config, facts) if not s.problems()]  # fmt: skip
    return f"engine choices, decode KV tokens: {'; '.join(parts)} (python -m eks_pd_serving sizing for more)"
