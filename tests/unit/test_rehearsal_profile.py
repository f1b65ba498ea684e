"""The rehearsal's config path: it reads the synthesized RayService, changes only the documented
local profile, and its verdict fails when the KV evidence is missing."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest
from support import leaves

from eks_pd_serving.endpoint import proxy
from eks_pd_serving.fault_tolerance import kv_guard
from eks_pd_serving.k8s import serve_config
from eks_pd_serving.phase import Phase
from rehearsal import profile, verdict


def test_reads_the_ray_service_cdk_synth_wrote(template_file: Path) -> None:
    service = profile.ray_service_from_template(template_file, region="eu-west-1")
    assert (service["metadata"]["name"], service["metadata"]["namespace"]) == ("ray-llm", "inference")
    head = service["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert head["image"] == "763104351884.dkr.ecr.eu-west-1.amazonaws.com/ray:serve-llm-cuda-v1.0"
    apps = profile.serve_config(service)["applications"]
    assert [(app["name"], app["import_path"]) for app in apps] == [
        ("pd-prefill", "eks_pd_failover:build_prefill_app"),
        ("pd-decode", "eks_pd_failover:build_decode_app"),
        ("pd-openai", "eks_pd_failover:build_ingress_app"),
    ]


def test_local_profile_changes_only_what_is_documented(template_file: Path) -> None:
    deployed = profile.serve_config(profile.ray_service_from_template(template_file))
    rehearsed = profile.local_profile(deployed, Path("/ckpt"))
    before, after = by_app(deployed), by_app(rehearsed)
    changed = {k for k in after if before.get(k) != after[k]}
    # Without a local S3 the engines load the checkpoint itself: the node cache's callback goes.
    assert set(before) - set(after) == {
        f"{app}/args/llm_config/callback_config/{key}"
        for app in ("pd-prefill", "pd-decode")
        for key in ("callback_class", "callback_kwargs/source", "callback_kwargs/compiled")
    }
    # Every prompt disaggregated: the rehearsal's prompts are all short (profile.every_prompt_disaggregated).
    assert changed == {f"{app}/deployments/0/user_config/short_prompt_tokens" for app in ("pd-decode", "pd-openai")} | {
        f"{app}/args/llm_config/{key}"
        for app in ("pd-prefill", "pd-decode")
        for key in (
            "model_loading_config/model_source",
            "placement_group_config/bundles/0/CPU",
            "engine_kwargs/max_model_len",
            "engine_kwargs/kv_transfer_config/kv_buffer_device",
            "engine_kwargs/kv_transfer_config/kv_connector_extra_config/backends",
        )
    }
    assert "+        model_source: /ckpt" in profile.diff(deployed, rehearsed)
    # With the local S3 the callback stays, filling a folder of this machine's node cache from it.
    staged = profile.local_profile(deployed, Path("/ckpt"), "s3://rehearsal-model-weights/models/q/main")
    llm = serve_config.llm_config(staged, Phase.DECODE)
    assert llm["callback_config"]["callback_kwargs"]["source"] == "s3://rehearsal-model-weights/models/q/main"
    assert llm["model_loading_config"]["model_source"] == str(
        profile.LOCAL_NODE_CACHE / "weights" / "Qwen--Qwen3.5-9B" / "main"
    )


def test_worker_env_keeps_the_models_settings_and_drops_efa_only_ones(template_file: Path) -> None:
    env = profile.worker_env(profile.ray_service_from_template(template_file))
    # RAY_LOG_TO_STDERR stays: the rehearsal shows the NIXL line where a pod's log would have it;
    # the region (the weights' S3 reads; AWS_DEFAULT_REGION is the one botocore reads) too.
    # The proxy checks' and the KV guard's mounts become the package's folders holding the same files.
    proxy_code, guard = (str(Path(str(m.__file__)).parent) for m in (proxy, kv_guard))
    assert env.pop("PYTHONPATH").split(os.pathsep)[:2] == [proxy_code, guard]
    # The compile caches move from the node's disk to this machine's stand-in for it.
    compiled = {k: env.pop(k) for k in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    assert all(v.startswith(f"{profile.LOCAL_NODE_CACHE}/compile/") for v in compiled.values())
    assert env == {"VLLM_SSM_CONV_STATE_LAYOUT": "DS", "VLLM_HOST_IP": "127.0.0.1", "RAY_LOG_TO_STDERR": "1",
                   "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1",
                   "RAYLLM_VLLM_ENGINE_CLS": "eks_pd_kv_guard:KvGuardEngine", "EKS_PD_KV_GUARD": "auto",
                   # Every Serve proxy bounds the body, with or without API keys.
                   "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": "eks_pd_api_keys:middlewares",
                   "EKS_PD_MAX_BODY_BYTES": str(16 * 2**20)}  # fmt: skip


def test_worker_env_refuses_a_template_whose_kv_guard_code_is_not_this_packages(template_file: Path) -> None:
    service = profile.ray_service_from_template(template_file)
    (group, *_) = service["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    group["template"]["metadata"]["annotations"][profile.KV_GUARD_CODE] = "0" * 16
    with pytest.raises(ValueError, match="synthesize again"):
        profile.worker_env(service)


def test_merged_env_joins_pythonpath_and_lets_later_values_win() -> None:
    merged = profile.merged_env({"PYTHONPATH": "/a", "X": "1"}, {"PYTHONPATH": "/b:/a", "X": "2"}, {})
    assert merged == {"PYTHONPATH": os.pathsep.join(["/a", "/b"]), "X": "2"}


def test_colocated_control_has_no_connector(template_file: Path) -> None:
    rehearsed = profile.local_profile(
        profile.serve_config(profile.ray_service_from_template(template_file)), Path("/ckpt")
    )
    (app,) = profile.colocated_control(rehearsed)["applications"]
    assert app["import_path"] == "ray.serve.llm:build_openai_app"
    (llm,) = app["args"]["llm_configs"]
    assert "kv_transfer_config" not in llm["engine_kwargs"]


def _request(kind: str, external: float, transfers: float, text: str = "x") -> dict[str, Any]:
    return {
        "kind": kind,
        "prompt": "p",
        "text": text,
        "prompt_tokens": 10,
        "engine": {
            "external_kv_tokens": external,
            "local_tokens": 1,
            "nixl_transfers": transfers,
            "nixl_bytes": 100 * transfers,
        },
    }


def _report(pd: list[dict[str, Any]], colocated: list[dict[str, Any]]) -> dict[str, Any]:
    run = {"ready_s": 1.0, "ready_from_start_s": 2.0, "errors": {"malformed": 400, "unknown_model": 404}}
    return {"pd": {**run, "requests": pd}, "colocated": {**run, "requests": colocated}}


def test_verdict_passes_when_every_request_moved_its_kv() -> None:
    ok, lines = verdict.judge(_report([_request("chat", 9, 1)], [_request("chat", 0, 0)]))
    assert ok and lines[-1].startswith("PASS")


@pytest.mark.parametrize(
    ("pd", "colocated", "message"),
    [
        ([_request("chat", 0, 0)], [_request("chat", 0, 0)], "no evidence decode loaded the KV"),
        ([_request("chat", 5, 1)], [_request("chat", 0, 0)], "no evidence decode loaded the KV"),
        ([_request("chat", 9, 1, "a")], [_request("chat", 0, 0, "b")], "PD output 'a' != colocated 'b'"),
        ([_request("chat", 9, 1)], [_request("chat", 9, 1)], "negative control moved KV"),
    ],
    ids=["no transfer", "partial transfer", "different output", "control not clean"],
)
def test_verdict_fails_without_evidence(
    pd: list[dict[str, Any]], colocated: list[dict[str, Any]], message: str
) -> None:
    ok, lines = verdict.judge(_report(pd, colocated))
    assert not ok
    assert any(message in line for line in lines if line.startswith("FAIL"))


def test_verdict_copies_nothing_it_did_not_judge() -> None:
    report = _report([_request("chat", 9, 1)], [_request("chat", 0, 0)])
    snapshot = copy.deepcopy(report)
    verdict.judge(report)
    assert report == snapshot


def test_the_rehearsed_autoscaled_config_is_the_default_plus_autoscaling(template_file: Path, tmp_path: Path) -> None:
    """The CPU rehearsal runs the autoscaled template (tests/rehearsal/test_rehearsal.py): its serve config
    differs from the default's only in the autoscaling keys, so the run rehearses both."""
    from support import synth_assembly

    template = synth_assembly(
        tmp_path, nag=False, autoscaling=True, prefill_max_replicas=1, decode_max_replicas=2,
        decode_target_ongoing_requests=1,
    )  # fmt: skip
    default = by_app(profile.serve_config(profile.ray_service_from_template(template_file)))
    deployed = profile.serve_config(profile.ray_service_from_template(template))
    scaled = by_app(deployed)
    differing = {k for k in default.keys() | scaled.keys() if default.get(k) != scaled.get(k)}
    # Only the phases' autoscaling overrides: no application's args (Serve restarts none for them).
    assert differing and all(
        k.split("/", 1)[0] in ("pd-prefill", "pd-decode")
        and k.split("/", 1)[1].startswith("deployments/0/autoscaling_config/")
        for k in differing
    ), differing
    rehearsed = profile.local_profile(deployed, Path("/ckpt"))
    local = by_app(rehearsed)
    changed = {k for k in local if scaled.get(k) != local[k]}
    assert {k for k in changed if "autoscaling_config" in k} == {
        f"{app}/deployments/0/autoscaling_config/upscale_delay_s" for app in ("pd-prefill", "pd-decode")
    }
    control = profile.colocated_control(rehearsed)["applications"][0]["args"]["llm_configs"][0]
    assert control["deployment_config"] == {"num_replicas": 1}


def by_app(serve_config: dict[str, Any]) -> dict[str, Any]:
    """Every leaf of the config's applications, by ``<application name>/<path>``."""
    return {
        f"{app['name']}{path}": value for app in serve_config["applications"] for path, value in leaves(app).items()
    }


def _autoscale_report(added_replica_kv: float) -> dict[str, Any]:
    stream = {"prompt_tokens": 45, "completion_tokens": 96}
    return {
        "replicas_before": {"RUNNING": 1},
        "replicas_after": {"RUNNING": 2},
        "bursts": [{"requests": [stream] * 6}, {"requests": [stream] * 6}],
        "engine": {"external_kv_tokens": 12 * 44, "nixl_transfers": 12},
        "replicas_with_kv_before_scale_up": ["old"],
        "external_kv_by_replica": {"old": 264.0 - added_replica_kv, "new": added_replica_kv},
    }


def test_the_autoscaling_verdict_needs_kv_on_the_added_replica() -> None:
    from rehearsal import autoscale

    scaling = {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 1.0}
    ok, lines = autoscale.judge(_autoscale_report(88.0), scaling)
    assert ok and lines[-1] == "PASS: the added decode replica loaded KV over NIXL: new: 88 prompt tokens"
    ok, lines = autoscale.judge(_autoscale_report(0.0), scaling)
    assert not ok and lines[-1] == "FAIL: the added decode replica loaded KV over NIXL: none"
    missing = _autoscale_report(88.0)
    missing["engine"]["external_kv_tokens"] -= 1  # one prompt token recomputed instead of pulled
    assert not autoscale.judge(missing, scaling)[0]


def test_the_s3_rehearsal_stages_under_the_deployed_prefix_and_proves_the_copy(tmp_path: Path) -> None:
    """The deployed bucket is a Ref (shown <LogicalId>); the prefix is kept. The proof holds only
    when the run's snapshot has the checkpoint's weights byte for byte."""
    from rehearsal import s3_weights

    assert s3_weights.prefix_of("s3://<PdServingModelWeightsBucket7E6EBD1E>/models/Qwen/Qwen3.5-9B/main") == (
        "models/Qwen/Qwen3.5-9B/main"
    )
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "model.safetensors").write_bytes(b"weights")
    staged = s3_weights.StagedWeights(uri="s3://b/p", env={}, sha="abc", cache=tmp_path / "cache")
    assert not staged.loaded_from_s3("qwen3.5-9b", checkpoint)  # nothing downloaded
    snapshot = staged.snapshot("qwen3.5-9b")
    assert snapshot == tmp_path / "cache" / "models--qwen3.5-9b" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "model.safetensors").write_bytes(b"other")
    assert not staged.loaded_from_s3("qwen3.5-9b", checkpoint)  # not the staged bytes
    (snapshot / "model.safetensors").write_bytes(b"weights")
    assert staged.loaded_from_s3("qwen3.5-9b", checkpoint)


def test_the_guards_annotation_is_the_mappings() -> None:
    from eks_pd_serving import mapping

    assert profile.KV_GUARD_CODE == mapping.KV_GUARD_CODE
