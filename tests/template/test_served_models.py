"""A second model from the settings (``served_models``, as cdk.json or ``-c`` name it): one more
value, sized for its own checkpoint, placed on GPUs the groups must hold, its weights staged like
the first's and its engines reading their own copy; every refusal one line with the fix."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from aws_cdk.assertions import Template
from support import build_stack, ray_service, resources_of_type, staged_uris

from eks_pd_serving import sizing
from eks_pd_serving.config import ConfigError, DeploymentConfig
from eks_pd_serving.k8s.serve_config import phase_llm_configs
from eks_pd_serving.mapping import rollout_deadline_s
from eks_pd_serving.weights import node_cache

# A commit hash: what pins a served model (the revision the engines and the staging job read).
REVISION = "b968826d9c46dd6066d109eabc6255188de91218"
SECOND = f"qwen3-8b=Qwen/Qwen3-8B@{REVISION}"
TWO = {"served_models": (SECOND,), "gpu_node_count": 4}


def engines(service: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """Each engine's LLMConfig by (model id, phase)."""
    config = yaml.safe_load(service["spec"]["serveConfigV2"])
    return {(llm["model_loading_config"]["model_id"], str(phase)): llm for phase, llm in phase_llm_configs(config)}


def test_a_second_model_is_one_more_entry_with_its_own_applications_weights_and_sizing() -> None:
    config = DeploymentConfig.from_context({"served_models": SECOND, "gpu_node_count": "4"})
    assert [str(m) for m in config.models] == ["qwen3.5-9b=Qwen/Qwen3.5-9B@main", SECOND]
    service = ray_service(**TWO)
    apps = [a["name"] for a in yaml.safe_load(service["spec"]["serveConfigV2"])["applications"]]
    assert apps == ["pd-prefill", "qwen3-8b-prefill", "pd-decode", "qwen3-8b-decode", "pd-openai"]
    found = engines(service)
    for phase in ("prefill", "decode"):
        second = found[("qwen3-8b", phase)]
        # Its own node folder, filled from its own staged copy, never the first model's.
        assert second["model_loading_config"]["model_source"] == (
            f"{node_cache.CACHE_PATH}/weights/Qwen--Qwen3-8B/{REVISION}"
        )
        assert second["callback_config"]["callback_kwargs"]["source"] == staged_uris(config)["qwen3-8b"]
        # Its own compile archive: its own settings, never the first model's.
        first = found[("qwen3.5-9b", phase)]["callback_config"]["callback_kwargs"]["compiled"]
        assert second["callback_config"]["callback_kwargs"]["compiled"] != first
        # Sized for its own checkpoint: a dense 8B's KV per sequence is not the hybrid 9B's.
        sizing = config.sizing(phase, config.facts_of(config.models[1]))  # type: ignore[arg-type]
        assert sizing is not None
        assert second["engine_kwargs"]["max_num_seqs"] == sizing.max_num_seqs
        assert second["engine_kwargs"]["max_num_seqs"] != found[("qwen3.5-9b", phase)]["engine_kwargs"]["max_num_seqs"]
    # Dense models fail a lost KV load (vLLM's V2 runner rolls recompute back wrongly); the hybrid 9B recomputes.
    assert found[("qwen3-8b", "decode")]["engine_kwargs"]["kv_transfer_config"]["kv_load_failure_policy"] == "fail"
    models = {
        m["model_id"] for m in yaml.safe_load(service["spec"]["serveConfigV2"])["applications"][-1]["args"]["models"]
    }
    assert models == {"qwen3.5-9b", "qwen3-8b"}


def test_the_hub_revision_reaches_the_second_models_engines() -> None:
    found = engines(ray_service(weights_source="huggingface", **TWO))
    for phase in ("prefill", "decode"):
        llm = found[("qwen3-8b", phase)]
        assert llm["model_loading_config"]["model_source"] == "Qwen/Qwen3-8B"
        assert llm["engine_kwargs"]["revision"] == REVISION


def test_the_deploy_stages_each_models_revision_and_the_ray_service_waits_for_all() -> None:
    rendered = dict(Template.from_stack(build_stack(**TWO)).to_json())
    staging = {name: r["Properties"] for name, r in resources_of_type(rendered, "Custom::ModelWeights").items()}
    assert sorted((p["Model"], p["Revision"], p["Prefix"]) for p in staging.values()) == [
        ("Qwen/Qwen3-8B", REVISION, f"models/Qwen/Qwen3-8B/{REVISION}"),
        ("Qwen/Qwen3.5-9B", "main", "models/Qwen/Qwen3.5-9B/main"),
    ]
    # One job and one provider stage every revision.
    assert len({json.dumps(p["ProjectName"]) for p in staging.values()}) == 1
    assert len({json.dumps(p["ServiceToken"]) for p in staging.values()}) == 1
    (manifest,) = [r for r in resources_of_type(rendered, "Custom::AWSCDK-EKS-KubernetesResource").values()
                   if '"kind\\":\\"RayService\\"' in json.dumps(r["Properties"]["Manifest"])]  # fmt: skip
    assert set(staging) <= set(manifest["DependsOn"]), "the engines would start before their weights are staged"


def test_the_rollout_waits_for_the_largest_models_read() -> None:
    four_gpus = {
        "model_source": "Qwen/Qwen3-8B",
        "model_id": "q8",
        "gpu_instance_type": "g6e.12xlarge",
        "gpu_node_count": 1,
    }
    one = DeploymentConfig.create(**four_gpus)
    both = DeploymentConfig.create(**four_gpus, served_models=("q30=Qwen/Qwen3-30B-A3B-FP8",))
    assert (rollout_deadline_s(one), rollout_deadline_s(both)) == (720, 780)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"served_models": SECOND},
            "(prefill_replicas=1 x prefill_tensor_parallel_size=1 + decode_replicas=1 x "
            "decode_tensor_parallel_size=1) x 2 served models needs 4 GPUs, but gpu_node_count=2 x g6.8xlarge has 2. "
            "Fix: raise gpu_node_count to 4 or lower replicas or serve fewer models (served_models)",
        ),
        (
            {"served_models": "bad entry"},
            "served_models='bad entry': 'bad entry' is not model_id=repository@revision, such as "
            "qwen3-8b=Qwen/Qwen3-8B@main (no @revision: main). Fix: set served_models to entries "
            "model_id=repository@revision such as qwen3-8b=Qwen/Qwen3-8B@main, comma-separated",
        ),
        (
            {"served_models": "x=Foo/Bar", "gpu_node_count": "4"},
            "served_models entry x=Foo/Bar@main: Foo/Bar is not in the model catalogue (",
        ),
        (
            {"served_models": "qwen3.5-9b=Qwen/Qwen3-8B", "gpu_node_count": "4"},
            "served_models entry qwen3.5-9b=Qwen/Qwen3-8B@main has the model id 'qwen3.5-9b' of "
            "qwen3.5-9b=Qwen/Qwen3.5-9B@main. Fix: give it a model_id of its own",
        ),
        (
            {"served_models": "pd=Qwen/Qwen3-8B", "gpu_node_count": "4"},
            "served_models entry pd=Qwen/Qwen3-8B@main has the Serve application prefix 'pd' of "
            "qwen3.5-9b=Qwen/Qwen3.5-9B@main. Fix: give it a model_id of its own",
        ),
        (
            {"served_models": SECOND, "gpu_node_count": "4", "pd_failover": "false"},
            "served_models needs pd_failover=true",
        ),
        (
            {"served_models": "l8=meta-llama/Llama-3.1-8B-Instruct", "gpu_node_count": "4"},
            "served_models entry l8=meta-llama/Llama-3.1-8B-Instruct@main: meta-llama/Llama-3.1-8B-Instruct is "
            "gated on the Hugging Face Hub and needs a token. Fix: set weights_source=s3 and hf_token_secret",
        ),
        (
            {"served_models": "q32=Qwen/Qwen3-32B", "gpu_node_count": "4"},
            "served_models entry q32=Qwen/Qwen3-32B@main: max_model_len=4096 with dtype=bfloat16, "
            "gpu_memory_utilization=0.9 and prefill_tensor_parallel_size=1 on gpu_instance_type=g6.8xlarge: the "
            "weights and activations need 61.6 GiB per GPU",
        ),
        (
            {
                "served_models": ",".join(f"m{k}=Qwen/Qwen3-8B" for k in range(10)),
                "gpu_node_count": "3",
                "gpu_instance_type": "g6.48xlarge",
            },
            "served_models names 10 models; with model_source that is 11, and one RayService serves at most 10",
        ),
    ],
)
def test_a_served_model_that_cannot_work_is_refused_with_one_line(settings: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        DeploymentConfig.from_context(settings)
    assert str(refused.value).startswith(message), str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(("settings", "engines_sized"), [({}, 2), (TWO, 4)])
def test_each_engine_is_sized_once_a_synth(monkeypatch: pytest.MonkeyPatch, settings: dict[str, Any],
                                           engines_sized: int) -> None:  # fmt: skip
    """The validation, the mapping and the charts ask each engine's sizing; it is computed once per
    phase and model (was 6 times for the default's two engines)."""
    from eks_pd_serving.config import derived

    derived._sized.cache_clear()
    sized: list[str] = []
    real = sizing.size

    def counted(*args: Any, **kwargs: Any) -> sizing.Sizing:
        sized.append(args[1].gpu_name)
        return real(*args, **kwargs)

    monkeypatch.setattr(derived, "size", counted)
    build_stack(decode_max_num_seqs=8, **settings)
    assert len(sized) == engines_sized


def test_cost_prices_each_models_staged_weights() -> None:
    import datetime

    from eks_pd_serving.cli.cost import estimate

    template = dict(Template.from_stack(build_stack(**TWO)).to_json())
    lines, _ = estimate(template, "us-east-1", datetime.date(2026, 12, 6))
    staged = sorted((line.item, line.quantity) for line in lines if line.item.startswith("Model weights in S3"))
    assert staged == [("Model weights in S3", 16.4), ("Model weights in S3", 18.0)]


def test_the_largest_checkpoint_bounds_the_wait_and_an_unknown_one_takes_the_unknown_size() -> None:
    from eks_pd_serving.catalog import MODELS
    from eks_pd_serving.sizing import checkpoint_bytes, largest_checkpoint_bytes

    small, large = MODELS["Qwen/Qwen3-8B"], MODELS["Qwen/Qwen3-30B-A3B-FP8"]
    assert largest_checkpoint_bytes([small, large]) == checkpoint_bytes(large) > checkpoint_bytes(small)
    assert largest_checkpoint_bytes([small, None]) is None and largest_checkpoint_bytes([]) is None


def test_a_typed_model_of_a_staged_revision_loads_that_copy() -> None:
    """``PdServing(models=...)`` replaces the settings' models; a value whose weights are one of the
    revisions the settings stage (here ``served_models``' second) loads that staged copy."""
    from dataclasses import replace

    import aws_cdk as cdk

    from eks_pd_serving import PdServing, k8s, mapping

    config = DeploymentConfig.create(**TWO)
    first = mapping.served_model(config)
    second = replace(first, name="q8", model=replace(first.model, model_id="q8",
                                                     weights=k8s.Weights("Qwen/Qwen3-8B", REVISION)))  # fmt: skip
    serving = PdServing(cdk.Stack(cdk.App(), "Typed"), "PdServing", config=config, models=[first, second])
    assert serving.weights is not None
    staged = {m.model.model_id: m.model.weights.staged_uri for m in serving.ray_service.props.models}
    assert staged == {"qwen3.5-9b": serving.weights.uri, "q8": serving.weights.more["qwen3-8b"][0]}
