"""Fixtures shared by every tier: one synthesized default stack per session (a synth costs
seconds). Helpers are in support.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from aws_cdk.assertions import Template
from support import build_stack, synth_assembly

from stacks.pd_serving_stack import PdServingStack


@pytest.fixture(scope="session")
def default_stack() -> PdServingStack:
    return build_stack()


@pytest.fixture(scope="session")
def template(default_stack: PdServingStack) -> Template:
    return Template.from_stack(default_stack)


@pytest.fixture(scope="session")
def stack_factory() -> Callable[..., PdServingStack]:
    return build_stack


@pytest.fixture(scope="session")
def template_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default app's template, synthesized with cdk-nag on (so it also passed cdk-nag)."""
    return synth_assembly(tmp_path_factory.mktemp("cdk.out"))
