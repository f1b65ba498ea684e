#!/usr/bin/env python3
"""Reads the configuration once, then wires the stack. Bad settings exit 2 with one line."""

from __future__ import annotations

import sys

import aws_cdk as cdk

from eks_pd_serving.config import ConfigError, DeploymentConfig
from eks_pd_serving.engine_choices import what_if_line
from eks_pd_serving.phase import PHASES
from eks_pd_serving.sizing import Sizing
from stacks.pd_serving_stack import PdServingStack

STACK_NAME = "RayLlmPdServing"


def print_sizing(config: DeploymentConfig) -> None:
    """The per-GPU memory and KV-transfer estimate of each phase on its own GPU group's type
    (synth already enforced it)."""
    summaries: dict[tuple[str, str], Sizing | None] = {
        (phase, config.gpu_group(phase).instance_type): config.sizing(phase) for phase in PHASES
    }
    (prefill, decode) = summaries
    if summaries[prefill] == summaries[decode] and prefill[1] == decode[1]:
        summaries = {("prefill and decode", prefill[1]): summaries[prefill]}
    for (phases, instance_type), sizing in summaries.items():
        if sizing is not None:
            print(f"sizing ({phases}, {config.model_source} on {instance_type}, per GPU):", file=sys.stderr)
            for line in sizing.summary():
                print(f"  {line}", file=sys.stderr)
    if config.model_facts is not None:
        print(what_if_line(config, config.model_facts), file=sys.stderr)
    for choice in config.models[1:]:  # served_models: each sized for its own checkpoint
        sizes = {phase: config.sizing(phase, config.facts_of(choice)) for phase in PHASES}
        seqs = ", ".join(f"{phase} max_num_seqs {s.max_num_seqs}" for phase, s in sizes.items() if s is not None)
        print(f"sizing ({choice.model_id}, {choice.repository}): {seqs}", file=sys.stderr)


def main() -> None:
    app = cdk.App()
    context = app.node.get_all_context()
    try:
        config = DeploymentConfig.from_context(context)
        print_sizing(config)
        env = cdk.Environment(region=config.region) if config.region else None
        # A construct's refusal (ConstructError, a ConfigError) is one line too, never a traceback.
        PdServingStack(app, STACK_NAME, config=config, env=env)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    app.synth()


if __name__ == "__main__":
    main()
