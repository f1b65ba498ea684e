"""Which Serve application a change restarts: each phase is an application of its own, so Serve
(which versions an application by its ``args``, import path and runtime env) restarts only the
phase whose engine changed; what Serve applies in place (replicas, autoscaling, the failover's
settings) never reaches any application's ``args``; and none of these changes the RayCluster."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import ROOT, ray_service

RAY_PYTHON = Path(os.environ.get("EKS_PD_RAY_PYTHON", ROOT / ".venv-ray" / "bin" / "python"))
VERSIONED = ("import_path", "runtime_env", "args")  # what Serve 2.58 hashes into an app's code version


def applications(service: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {app["name"]: app for app in yaml.safe_load(service["spec"]["serveConfigV2"])["applications"]}


def restarted(before: dict[str, Any], after: dict[str, Any]) -> set[str]:
    """The applications Serve rebuilds (every replica restarted) going from ``before`` to ``after``."""
    old, new = applications(before), applications(after)
    return {name for name in old.keys() | new.keys() if name not in old or name not in new} | {
        name for name in old.keys() & new.keys() if any(old[name].get(k) != new[name].get(k) for k in VERSIONED)
    }


@pytest.mark.parametrize(
    ("base", "change", "expected"),
    [
        ({}, {"decode_max_num_seqs": 8}, {"pd-decode"}),
        ({}, {"prefill_max_num_seqs": 8}, {"pd-prefill"}),
        ({}, {"prefill_enforce_eager": False}, {"pd-prefill"}),
        # A change of both phases' engines: both, rolled one at a time by the serve rollout.
        ({}, {"max_model_len": 8192}, {"pd-prefill", "pd-decode", "pd-openai"}),
        # What Serve applies in place: no application's args.
        ({"autoscaling": True}, {"autoscaling": True, "decode_target_ongoing_requests": 6}, set()),
        ({"autoscaling": True}, {"autoscaling": True, "decode_max_replicas": 3}, set()),
        ({}, {"failover_wait_s": 5, "failover_prefill_timeout_s": 20, "short_prompt_tokens": 64}, set()),
    ],
)
def test_a_change_restarts_the_applications_of_the_phases_it_touches(
    base: dict[str, Any], change: dict[str, Any], expected: set[str]
) -> None:
    before, after = ray_service(**base), ray_service(**{**base, **change})
    assert before["spec"]["serveConfigV2"] != after["spec"]["serveConfigV2"]  # the change reached the config
    assert restarted(before, after) == expected
    if change.keys() != {"autoscaling", "decode_max_replicas"}:  # the node bounds follow the replica bound
        assert before["spec"]["rayClusterConfig"] == after["spec"]["rayClusterConfig"]


def test_an_engine_setting_that_changes_the_kv_layout_unpairs_the_phases() -> None:
    """Decode pulls KV only from a prefill with its pair key: one of a model, a weight format and
    a transfer. A per-phase engine setting leaves it; a model setting changes both phases' key."""
    pairs = {
        name: {app: spec["args"].get("pair") for app, spec in applications(ray_service(**settings)).items()}
        for name, settings in (("default", {}), ("seqs", {"decode_max_num_seqs": 8}), ("len", {"max_model_len": 8192}))
    }
    assert pairs["default"]["pd-prefill"] == pairs["default"]["pd-decode"] == pairs["seqs"]["pd-decode"]
    assert pairs["len"]["pd-prefill"] == pairs["len"]["pd-decode"] != pairs["default"]["pd-decode"]


SMALL_REVISION = "c1899de289a04d12100db370d81485cdf75e47ca"


def two_models(staged_uri: str = "") -> dict[str, Any]:
    """The settings' model (staged, through the node cache: the defaults) and a second one added as
    typed props (``RayServiceProps.models``), as the construct guide adds it: from the Hub at a
    pinned revision, or staged at ``staged_uri``."""
    from support import render_props

    from eks_pd_serving import k8s

    def add(props: k8s.RayServiceProps) -> k8s.RayServiceProps:
        (first,) = props.models
        weights = k8s.Weights("Qwen/Qwen3-0.6B", SMALL_REVISION, staged_uri=staged_uri)
        second = replace(first, name="small", model=replace(first.model, model_id="qwen3-0.6b", weights=weights))
        return replace(props, models=(first, second))

    return render_props(add, gpu_node_count=4)  # a GPU for each phase of each model


def test_a_second_model_from_typed_props_gets_its_own_phase_applications_behind_one_ingress() -> None:
    service = two_models()
    apps = applications(service)
    assert list(apps) == ["pd-prefill", "small-prefill", "pd-decode", "small-decode", "pd-openai"]
    assert apps["small-decode"]["args"]["prefill"] == {"app": "small-prefill", "deployment": "Prefill:qwen3-0_6b"}
    assert [m["model_id"] for m in apps["pd-openai"]["args"]["models"]] == ["qwen3.5-9b", "qwen3-0.6b"]
    assert apps["small-prefill"]["args"]["pair"] != apps["pd-prefill"]["args"]["pair"]
    # Each model's NIXL side channels from a window of their own (two prefill engines of rank 0 on
    # one node both bound 20000 in the two-model rehearsal); the first model's stay where they were.
    bases = {name: app["args"]["llm_config"]["experimental_configs"]["NIXL_SIDE_CHANNEL_PORT_BASE"]
             for name, app in apps.items() if name != "pd-openai"}  # fmt: skip
    assert bases == {"pd-prefill": 20000, "small-prefill": 20100, "pd-decode": 21000, "small-decode": 21100}


def _weights_view(service: dict[str, Any], app: str) -> dict[str, Any]:
    llm = applications(service)[app]["args"]["llm_config"]
    return {
        "source": llm["model_loading_config"]["model_source"],
        "revision": llm["engine_kwargs"].get("revision"),
        "fill": _without_compiled(llm.get("callback_config")),
    }


def _without_compiled(callback: dict[str, Any] | None) -> dict[str, Any] | None:
    """The fill's callback, less each engine's own compile archive (tests/template/test_node_cache.py)."""
    if not callback:
        return callback
    kwargs = {k: v for k, v in callback["callback_kwargs"].items() if k != "compiled"}
    return {**callback, "callback_kwargs": kwargs}


def test_each_models_engines_read_their_own_weights_under_the_defaults() -> None:
    """The guide's example under the default settings (weights_source=s3, node_cache on): the
    first model's engines read the node's copy of its staged revision, filled from there; a second
    model from the Hub reads the Hub at its own pinned revision (no fill); staged, its own folder
    filled from its own copy. Every path is derived from ``k8s.Weights``, never stored beside it."""
    from support import STAGED_URI

    from eks_pd_serving.weights import node_cache

    fill = node_cache.callback_class()
    first = {
        "source": f"{node_cache.CACHE_PATH}/weights/Qwen--Qwen3.5-9B/main",
        "revision": None,
        "fill": {"callback_class": fill, "callback_kwargs": {"source": STAGED_URI}},
    }
    hub, staged = two_models(), two_models(staged_uri="s3://weights-bucket/weights/Qwen/Qwen3-0.6B/x")
    for service in (hub, staged):
        for phase in ("prefill", "decode"):
            assert _weights_view(service, f"pd-{phase}") == first
    for phase in ("prefill", "decode"):
        assert _weights_view(hub, f"small-{phase}") == {
            "source": "Qwen/Qwen3-0.6B",
            "revision": SMALL_REVISION,
            "fill": None,
        }
        assert _weights_view(staged, f"small-{phase}") == {
            "source": f"{node_cache.CACHE_PATH}/weights/Qwen--Qwen3-0.6B/{SMALL_REVISION}",
            "revision": None,
            "fill": {
                "callback_class": fill,
                "callback_kwargs": {"source": "s3://weights-bucket/weights/Qwen/Qwen3-0.6B/x"},
            },
        }
    # A model from the Hub keeps Hugging Face's cache on the node's disk; all staged, none.
    envs = [
        {
            e["name"]
            for g in s["spec"]["rayClusterConfig"]["workerGroupSpecs"]
            for e in g["template"]["spec"]["containers"][0]["env"]
        }
        for s in (hub, staged)
    ]
    assert "HF_HUB_CACHE" in envs[0] and "HF_HUB_CACHE" not in envs[1]


def test_two_models_may_not_share_a_model_id() -> None:
    from eks_pd_serving import k8s

    with pytest.raises(ValueError, match=r"each model_id must be unique \(the ingress routes by it\)"):
        from support import render_props

        render_props(
            lambda props: replace(props, models=(props.models[0], replace(props.models[0], name="again"))),
            gpu_node_count=4,
        )
    assert k8s.Weights("a/b", "r").words == "a/b@r"


@pytest.mark.ray
@pytest.mark.skipif(not RAY_PYTHON.exists(), reason=f"{RAY_PYTHON} missing: `make rayenv` creates it")
def test_ray_accepts_each_phase_and_each_models_pair(tmp_path: Path) -> None:
    manifest = tmp_path / "rayservice.json"
    manifest.write_text(json.dumps(two_models()))
    tool = ROOT / "tools" / "validate_serve_config.py"
    ran = subprocess.run([str(RAY_PYTHON), str(tool), str(manifest)], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    assert "'small-decode' and its prefill accepted together as PDServingArgs ('qwen3-0.6b'" in ran.stdout
    assert "application 'small-prefill' accepted: prefill of 'qwen3-0.6b', kv_producer, deployment" in ran.stdout
    # The same check refuses a decode whose prefill is another model's (its pair key differs).
    broken = two_models()
    config = yaml.safe_load(broken["spec"]["serveConfigV2"])
    config["applications"][3]["args"]["pair"] = config["applications"][0]["args"]["pair"]
    broken["spec"]["serveConfigV2"] = yaml.safe_dump(config)
    manifest.write_text(json.dumps(broken))
    ran = subprocess.run([str(RAY_PYTHON), str(tool), str(manifest)], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 1 and "its pair key" in ran.stderr


def dashboard(service: dict[str, Any], nodes: dict[str, str]) -> dict[str, Any]:
    """What Ray's dashboard answers on /api/serve/applications/ for a serve config that serves
    (Ray 2.58's ``schema.ApplicationDetails``: status, ``deployed_app_config``, each deployment's
    status and replicas with their ``node_ip``); ``nodes``: each phase application's node IP."""
    found = {}
    for name, app in applications(service).items():
        deployments = {
            d["name"]: {
                "name": d["name"],
                "status": "HEALTHY",
                "replicas": [{"node_ip": nodes.get(name, "10.0.0.9"), "state": "RUNNING"}],
            }
            for d in app.get("deployments") or []
        }
        found[name] = {"name": name, "status": "RUNNING", "deployed_app_config": app, "deployments": deployments}
    return {"applications": found}


def test_verify_checks_each_models_pair_by_its_applications() -> None:
    from eks_pd_serving.cli import verify

    service = two_models()
    ips = {"pd-prefill": "10.0.0.1", "pd-decode": "10.0.0.2", "small-prefill": "10.0.0.3", "small-decode": "10.0.0.4"}
    pods = {ip: f"node-{ip[-1]}" for ip in ips.values()}
    checks = verify.check_served_models(dashboard(service, ips), pods)
    assert [(c.name, c.passed, c.detail) for c in checks] == [
        ("model qwen3.5-9b", True, "prefill on ['node-1'], decode on ['node-2']"),
        ("model qwen3-0.6b", True, "prefill on ['node-3'], decode on ['node-4']"),
    ]
    # One model's decode on its prefill's node, its other phase failed, and its pair keys apart.
    broken = dashboard(service, {**ips, "small-decode": "10.0.0.3"})
    broken["applications"]["small-prefill"]["status"] = "DEPLOY_FAILED"
    broken["applications"]["small-decode"]["deployed_app_config"]["args"]["pair"] = "0000"
    first, second = verify.check_served_models(broken, pods)
    assert first.passed and not second.passed
    assert second.detail.startswith("small-prefill DEPLOY_FAILED; pair keys differ (prefill ")
    assert second.detail.endswith("; prefill and decode both on ['node-3']")


@pytest.mark.ray
@pytest.mark.skipif(not RAY_PYTHON.exists(), reason=f"{RAY_PYTHON} missing: `make rayenv` creates it")
def test_what_verify_reads_is_rays_own_application_details(tmp_path: Path) -> None:
    """The dashboard answer ``check_served_models`` is tested on holds Ray 2.58's field names and
    statuses (``ApplicationDetails``); a status Ray does not have is refused."""
    answer = tmp_path / "applications.json"
    tool = str(ROOT / "tools" / "validate_serve_details.py")
    served = dashboard(two_models(), {"pd-prefill": "10.0.0.1", "pd-decode": "10.0.0.2"})
    answer.write_text(json.dumps(served))
    ran = subprocess.run([str(RAY_PYTHON), tool, str(answer)], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0 and "accepted 5 applications" in ran.stdout, ran.stderr
    served["applications"]["small-decode"]["deployments"]["Decode:qwen3-0_6b"]["status"] = "FINE"
    answer.write_text(json.dumps(served))
    ran = subprocess.run([str(RAY_PYTHON), tool, str(answer)], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 1 and "application small-decode: not Ray's ApplicationDetails" in ran.stderr


def test_nixl_port_windows_that_cannot_hold_the_models_are_refused() -> None:
    from support import RAY_IMAGE

    from eks_pd_serving.config import DeploymentConfig
    from eks_pd_serving.k8s.serve_config import build_serve_config
    from eks_pd_serving.mapping import ray_service_props

    (first,) = ray_service_props(DeploymentConfig.create(), RAY_IMAGE).models
    many = [replace(first, name=f"m{k}", model=replace(first.model, model_id=f"m{k}")) for k in range(11)]
    with pytest.raises(ValueError, match=r"11 models; each phase's NIXL ports hold 10"):
        build_serve_config(many)
    wide = replace(first, decode=replace(first.decode, replicas=51, tensor_parallel_size=2))
    with pytest.raises(ValueError, match=r"qwen3.5-9b's decode needs 102 NIXL ports .* its window holds 100"):
        build_serve_config([wide])
    assert build_serve_config(many[:10])  # ten fit
