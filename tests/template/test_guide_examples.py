"""The construct guide's examples run as written (docs/guides/construct.md): each ```python block is
executed with the default settings it shows, and what it built is checked: the models served, where
each model's engines read their weights, and the GPU accounting that refuses a model that does not fit."""

from __future__ import annotations

import re
import textwrap
from dataclasses import replace
from typing import Any

import pytest
from support import ROOT

from eks_pd_serving import DeploymentConfig, PdServing, k8s, mapping
from eks_pd_serving.config import ConstructError
from eks_pd_serving.k8s.serve_config import build_serve_config, phase_llm_configs

GUIDE = ROOT / "docs" / "guides" / "construct.md"


def examples() -> list[str]:
    """Every python block of the guide, dedented (some sit inside a list item)."""
    blocks = re.findall(r"^( *)```python\n(.*?)^\1```", GUIDE.read_text(), flags=re.S | re.M)
    return [
        textwrap.dedent("\n".join(line.removeprefix(indent) for line in body.splitlines())) for indent, body in blocks
    ]


def run(source: str) -> PdServing:
    namespace: dict[str, Any] = {}
    exec(compile(source, str(GUIDE), "exec"), namespace)
    (serving,) = [c for c in namespace["stack"].node.children if isinstance(c, PdServing)]
    return serving


def sources(serving: PdServing) -> dict[str, tuple[str, Any]]:
    """Each model's engines: where they read the weights and the fill's source, by model id."""
    props = serving.ray_service.props
    config = build_serve_config(props.models, props.node_cache)
    found: dict[str, tuple[str, Any]] = {}
    for _, llm in phase_llm_configs(config):
        kwargs = dict((llm.get("callback_config") or {}).get("callback_kwargs") or {})
        kwargs.pop("compiled", None)  # each engine's own compile archive (tests/template/test_node_cache.py)
        seen = (llm["model_loading_config"]["model_source"], kwargs or None)
        assert found.setdefault(llm["model_loading_config"]["model_id"], seen) == seen  # both phases alike
    return found


def test_the_guide_has_its_two_examples() -> None:
    assert len(examples()) == 2


def test_the_first_example_serves_the_settings_model() -> None:
    serving = run(examples()[0])
    assert [m.model.model_id for m in serving.ray_service.props.models] == ["qwen3.5-9b"]
    assert serving.config.gpu_node_count == 4


def test_the_two_model_example_gives_each_model_its_own_weights_under_the_defaults() -> None:
    serving = run(examples()[1])
    assert serving.config.node_cache and serving.config.weights_source == "s3"  # the defaults
    staged = serving.weights.uri if serving.weights else None
    assert staged is not None
    found = sources(serving)
    assert found["qwen3.5-9b"] == ("/var/cache/eks-pd/weights/Qwen--Qwen3.5-9B/main", {"source": staged})
    assert found["qwen3-0.6b"] == ("Qwen/Qwen3-0.6B", None)
    engine = serving.ray_service.props.models[1].model
    assert engine.weights == k8s.Weights("Qwen/Qwen3-0.6B", "main") and engine.language_model_only is False


def test_a_model_that_does_not_fit_is_refused_at_synth_with_the_numbers() -> None:
    import aws_cdk as cdk

    config = DeploymentConfig.create(endpoint_allowed_cidrs=["203.0.113.0/24"], gpu_node_count=4)
    first = mapping.served_model(config)
    models = [first, *(replace(first, name=f"m{k}", model=replace(first.model, model_id=f"m{k}")) for k in (2, 3))]
    with pytest.raises(ConstructError) as refused:
        PdServing(cdk.Stack(cdk.App(), "Three"), "PdServing", config=config, models=models)
    assert str(refused.value) == (
        "Three/PdServing: RayServiceProps.models: qwen3.5-9b prefill 1 x tp 1 + qwen3.5-9b decode 1 x tp 1"
        " + m2 prefill 1 x tp 1 + m2 decode 1 x tp 1 + m3 prefill 1 x tp 1 + m3 decode 1 x tp 1 needs 6 GPUs on the"
        " GPU worker groups, which hold 4 (gpu-workers 4). Fix: give the groups more nodes (gpu_node_count, or the"
        " phase's own node count) or serve fewer replicas [GpuShortfall]"
    )
