"""Ray Serve LLM itself (Ray 2.58.0, the image's version) accepts the serve config we generate,
and rejects the mistakes that would otherwise surface only after a 30-minute deploy."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import GCS_STORE_ADDRESS, ROOT, ray_service, render

from eks_pd_serving import versions

RAY_PYTHON = Path(os.environ.get("EKS_PD_RAY_PYTHON", ROOT / ".venv-ray" / "bin" / "python"))
TOOL = ROOT / "tools" / "validate_serve_config.py"

pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(not RAY_PYTHON.exists(), reason=f"{RAY_PYTHON} missing: `make rayenv` creates it"),
]


def run_ray_check(tmp_path: Path, service: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    manifest = tmp_path / "rayservice.json"
    manifest.write_text(json.dumps(service))
    return subprocess.run(
        [str(RAY_PYTHON), str(TOOL), str(manifest)], capture_output=True, text=True, timeout=300, check=False
    )


def test_the_ray_venv_runs_the_images_ray_version() -> None:
    out = subprocess.run(
        [str(RAY_PYTHON), "-c", "import ray; print(ray.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == versions.RAY_VERSION


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"gpu_instance_type": "g6.12xlarge", "prefill_replicas": 2, "kv_buffer_device": "cpu"},
        {
            "gpu_layout": "per_phase",
            "prefill_gpu_instance_type": "g6e.8xlarge",
            "decode_gpu_node_count": 2,
            "decode_replicas": 2,
        },
        {"autoscaling": True, "gpu_layout": "per_phase", "prefill_min_replicas": 0, "decode_max_replicas": 4},
        {
            "quantization": "fp8",
            "prefill_enforce_eager": False,
            "decode_enforce_eager": False,
            "decode_max_num_seqs": 32,
        },
        {"weights_source": "huggingface", "model_revision": "0123abcd", "trust_request_chat_template": True},
    ],
    ids=["default", "two-prefill-replicas", "per-phase", "autoscaling", "fp8-graphs-pinned", "hub-pinned-templates"],
)
def test_ray_accepts_the_generated_serve_config(tmp_path: Path, settings: dict[str, Any]) -> None:
    result = run_ray_check(tmp_path, ray_service(**settings))
    assert result.returncode == 0, result.stderr
    for accepted in (
        "application 'pd-prefill' accepted: prefill of 'qwen3.5-9b', kv_producer, deployment 'Prefill:qwen3_5-9b'",
        "application 'pd-decode' accepted: decode of 'qwen3.5-9b', kv_consumer, deployment 'Decode:qwen3_5-9b'",
        "application 'pd-openai' accepted: ingress of 1 model(s)",
        "'pd-decode' and its prefill accepted together as PDServingArgs ('qwen3.5-9b', pair ",
    ):
        assert f"ray 2.58.0: {accepted}" in result.stdout


def test_ray_accepts_a_second_model_from_the_settings(tmp_path: Path) -> None:
    result = run_ray_check(tmp_path, ray_service(served_models=("qwen3-8b=Qwen/Qwen3-8B@main",), gpu_node_count=4))
    assert result.returncode == 0, result.stderr
    for accepted in (
        "application 'qwen3-8b-prefill' accepted: prefill of 'qwen3-8b', kv_producer, deployment 'Prefill:qwen3-8b'",
        "application 'qwen3-8b-decode' accepted: decode of 'qwen3-8b', kv_consumer, deployment 'Decode:qwen3-8b'",
        "application 'pd-openai' accepted: ingress of 2 model(s)",
        "'qwen3-8b-decode' and its prefill accepted together as PDServingArgs ('qwen3-8b', pair ",
    ):
        assert f"ray 2.58.0: {accepted}" in result.stdout


def test_ray_accepts_its_own_builder_without_the_failover(tmp_path: Path) -> None:
    result = run_ray_check(tmp_path, ray_service(pd_failover=False))
    assert result.returncode == 0, result.stderr
    accepted = "application 'pd-openai' accepted: model 'qwen3.5-9b', prefill kv_producer, decode kv_consumer"
    assert f"ray 2.58.0: {accepted}" in result.stdout


def _edit_args(service: dict[str, Any], edit: Callable[[dict[str, Any]], object]) -> dict[str, Any]:
    """``edit`` given a view of the first model (its phases' LLMConfigs as ``<phase>_config``, their
    deployment overrides as ``<phase>_deployment``, the decode application's args as ``decode_args``)."""
    serve = yaml.safe_load(service["spec"]["serveConfigV2"])
    prefill, decode = serve["applications"][0], serve["applications"][1]
    view = {
        "prefill_config": prefill["args"]["llm_config"],
        "decode_config": decode["args"]["llm_config"],
        "prefill_deployment": prefill["deployments"][0],
        "decode_deployment": decode["deployments"][0],
        "decode_args": decode["args"],
    }
    edit(view)
    service["spec"]["serveConfigV2"] = yaml.safe_dump(serve)
    return service


def _kv_beside_engine_kwargs(args: dict[str, Any]) -> None:
    side = args["prefill_config"]
    side["kv_transfer_config"] = side["engine_kwargs"].pop("kv_transfer_config")


BROKEN: list[tuple[str, Callable[[dict[str, Any]], object], str]] = [
    ("kv_transfer_config beside engine_kwargs", _kv_beside_engine_kwargs, "Extra inputs are not permitted"),
    (
        "model ids differ",
        lambda a: (
            a["decode_config"]["model_loading_config"].update(model_id="other"),
            a["decode_deployment"].update(name="Decode:other"),
        ),
        "P/D model id mismatch",
    ),
    (
        "no kv_transfer_config on decode",
        lambda a: a["decode_config"]["engine_kwargs"].pop("kv_transfer_config"),
        "kv_transfer_config is required for P/D disaggregation",
    ),
    ("unknown decode args key", lambda a: a["decode_args"].update(router_config={}), "a phase's args are"),
    ("a decode of another pair", lambda a: a["decode_args"].update(pair="other"), "its pair key other is not"),
    (
        "decode's prefill names no deployment of the config",
        lambda a: a["decode_args"]["prefill"].update(deployment="Prefill:other"),
        "not in the config",
    ),
    (
        "an override Ray would not find",
        lambda a: a["decode_deployment"].update(name="Decode:other"),
        "Ray names it 'Decode:qwen3_5-9b'",
    ),
    (
        "engines on a Ray the failover's record does not cover",
        lambda a: a["decode_args"].update(covered=[["2.99.0", "0.99.0"]]),
        "its engines would refuse to start on Ray 2.58.0",
    ),
    (
        "a failover setting the builder does not take",
        lambda a: a["decode_deployment"]["user_config"].update(retries=3),
        "user_config keys are",
    ),
    (
        "autoscaling target not positive",
        lambda a: a["decode_deployment"]["autoscaling_config"].update(target_ongoing_requests=0),
        "target_ongoing_requests",
    ),
    (
        "autoscaling min above max",
        lambda a: a["decode_deployment"]["autoscaling_config"].update(min_replicas=3, max_replicas=2),
        "max_replicas",
    ),
]


@pytest.mark.parametrize(("_name", "edit", "message"), BROKEN, ids=[b[0] for b in BROKEN])
def test_ray_rejects_a_broken_serve_config(
    tmp_path: Path, _name: str, edit: Callable[[dict[str, Any]], object], message: str
) -> None:
    result = run_ray_check(tmp_path, _edit_args(ray_service(), edit))
    assert result.returncode == 1
    assert "rejected by Ray" in result.stderr and message in result.stderr, result.stderr


# Ray 2.58's own decision, with /dev/shm and the memory Ray sees patched to a pod's: where the
# object store goes with the synthesized rayStartParams, and where it would go without them.
_PLASMA_PROBE = """
import json, sys, tempfile
import ray._common.utils, ray._private.utils
from ray._private import services
pods, out, tmp = json.load(sys.stdin), [], tempfile.mkdtemp()
for pod in pods:
    ray._private.utils.get_shared_memory_bytes = lambda: pod["shm"]
    ray._common.utils.get_system_memory = lambda: pod["memory"]
    default = ray._private.utils.resolve_object_store_memory(pod["memory"], None)
    result = {}
    for label, size in (("explicit", pod["store"]), ("default", default)):
        try:
            result[label] = services.determine_plasma_store_config(size, temp_dir=tmp)[0].replace(tmp, "<temp_dir>")
        except ValueError as error:
            result[label] = "refused: " + str(error)[:60]
    out.append(result)
print(json.dumps(out))
"""


def _gib(quantity: str) -> int:
    return int(quantity.removesuffix("Gi")) * 2**30


def test_ray_puts_each_pods_object_store_in_dev_shm(stack_factory: Callable[..., Any]) -> None:
    from aws_cdk.assertions import Template

    from eks_pd_serving.assembly import kubernetes_objects

    service = next(
        o for o in kubernetes_objects(Template.from_stack(stack_factory()).to_json()) if o["kind"] == "RayService"
    )
    cluster = service["spec"]["rayClusterConfig"]
    pods = []
    for group in (cluster["headGroupSpec"], *cluster["workerGroupSpecs"]):
        spec = group["template"]["spec"]
        memory = _gib(spec["containers"][0]["resources"]["limits"]["memory"])
        shm = _gib(spec["volumes"][0]["emptyDir"]["sizeLimit"])
        pods.append({"memory": memory, "shm": shm, "store": int(group["rayStartParams"]["object-store-memory"])})
    # The head without our volume: a container's own 64 MiB /dev/shm (the control).
    pods.append({**pods[0], "shm": 64 * 2**20})
    result = subprocess.run(
        [str(RAY_PYTHON), "-c", _PLASMA_PROBE], input=json.dumps(pods), capture_output=True, text=True, check=True
    )
    head, *workers, bare_head = json.loads(result.stdout)
    assert head["explicit"] == "/dev/shm" and all(w["explicit"] == "/dev/shm" for w in workers)
    # Without the volume Ray's default store (30% of 8 GiB) does not fit a 64 MiB /dev/shm: /tmp.
    assert bare_head["default"] == "<temp_dir>"


def _api_key_pods(tmp_path: Path, **settings: Any) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The ConfigMap's files written to ``tmp_path`` and each Ray pod's container (internal, with
    API keys, unless ``settings`` say otherwise)."""
    objects = render(**{"endpoint_exposure": "internal", **settings})
    (config_map,) = [o for o in objects if o["kind"] == "ConfigMap" and "eks_pd_api_keys.py" in o["data"]]
    for name, text in config_map["data"].items():
        (tmp_path / name).write_text(text)
    (service,) = [o for o in objects if o["kind"] == "RayService"]
    cluster = service["spec"]["rayClusterConfig"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    return config_map["data"], [g["template"]["spec"]["containers"][0] for g in groups]


def _run_hook(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(RAY_PYTHON), str(ROOT / "tools" / "check_proxy_hook.py")],
        capture_output=True, text=True, timeout=120, check=False, env={"PATH": os.environ["PATH"], **env},
    )  # fmt: skip


@pytest.mark.parametrize(("exposure", "keys"), [("internal", True), ("port-forward", False)])
def test_rays_proxy_hook_loads_the_checks_from_the_pods_config_map(tmp_path: Path, exposure: str, keys: bool) -> None:
    """On the head and every worker: the body's bound always, the API keys with the internal endpoint."""
    files, containers = _api_key_pods(tmp_path, endpoint_exposure=exposure)
    assert set(files) == {"eks_pd_api_keys.py"}
    for container in containers:
        env = {e["name"]: e.get("value", "") for e in container["env"]}
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "api-keys-code"]
        assert env["PYTHONPATH"].split(":")[0] == mount["mountPath"] and mount["readOnly"] is True
        assert ("EKS_PD_API_KEYS_SECRET" in env) is keys
        # On this machine the mount is tmp_path (the secret is unreachable: no AWS credentials here).
        # Without a key a request is refused before the router (health reaches it); a body one byte
        # over the bound is refused on every path, the open health path included.
        env["PYTHONPATH"] = str(tmp_path)
        result = _run_hook(env)
        assert result.returncode == 0, result.stdout + result.stderr
        limit, without_key = int(env["EKS_PD_MAX_BODY_BYTES"]), "401 refused" if keys else "200 reached"
        assert result.stdout.splitlines() == [
            "middlewares: " + ("ApiKeyMiddleware, " if keys else "") + "BodyLimitMiddleware",
            "/-/healthz 200 reached",
            f"/v1/models {without_key}",
            f"/-/routes {without_key}",
            f"POST {limit + 1} bytes 413 refused",
        ]


def test_without_the_mounted_code_the_proxy_does_not_start(tmp_path: Path) -> None:
    _files, containers = _api_key_pods(tmp_path)
    env = {e["name"]: e.get("value", "") for e in containers[0]["env"]}
    env["PYTHONPATH"] = str(tmp_path / "nothing-mounted")
    result = _run_hook(env)
    assert result.returncode == 1
    assert "eks_pd_api_keys:middlewares cannot be imported: No module named 'eks_pd_api_keys'" in result.stdout


# Ray 2.58's own parse of RAY_REDIS_ADDRESS (ray/_private/services.py get_address, which the head's
# node.py and start_gcs_server call), then KubeRay v1.7.0's Redis cleanup Job's parse of the same
# variable, verbatim from buildRedisCleanupJob (raycluster_controller.go).
_REDIS_ADDRESS_PROBE = """
import json, os, sys
from urllib.parse import urlparse
from ray._private.services import get_address
address = sys.stdin.read()
host, port, ssl = get_address(address)
redis_address = address.split(',')[0]
redis_address = redis_address if '://' in redis_address else 'redis://' + redis_address
parsed = urlparse(redis_address)
print(json.dumps({"ray": [host, int(port), ssl], "cleanup": [parsed.hostname, parsed.port, parsed.scheme == 'rediss']}))
"""


def _parse_redis_address(address: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(RAY_PYTHON), "-c", _REDIS_ADDRESS_PROBE], input=address, capture_output=True, text=True, check=False
    )


def test_ray_and_kuberays_cleanup_job_both_read_the_store_address_as_tls_on_its_port() -> None:
    options = ray_service()["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"]
    assert options["redisAddress"] == GCS_STORE_ADDRESS
    host = GCS_STORE_ADDRESS.removeprefix("rediss://").rsplit(":", 1)[0]
    expected = [host, versions.GCS_STORE_PORT, True]
    result = _parse_redis_address(options["redisAddress"])
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"ray": expected, "cleanup": expected}


def test_without_its_port_ray_refuses_the_store_address() -> None:
    """The control: the port is not optional (Ray's parse_address finds no host:port)."""
    host = GCS_STORE_ADDRESS.removeprefix("rediss://").rsplit(":", 1)[0]
    result = _parse_redis_address(f"rediss://{host}")
    assert result.returncode == 1 and "in get_address" in result.stderr


# Ray 2.58's own code version of each application (serve/_private/deploy_utils.get_app_code_version).
_CODE_VERSION_PROBE = """
import json, sys
from ray.serve._private.deploy_utils import get_app_code_version
from ray.serve.schema import ServeApplicationSchema
print(json.dumps([get_app_code_version(ServeApplicationSchema.model_validate(a)) for a in json.load(sys.stdin)]))
"""


def test_impact_reads_the_code_version_as_ray_hashes_it() -> None:
    """``lifecycle.rollout.code_version`` changes exactly when Ray 2.58's application code version
    does: for an engine setting, the failover's settings, replicas, autoscaling bounds and policy,
    a request router and the import path, on each of the three applications."""
    from eks_pd_serving.lifecycle.rollout import code_version

    base = yaml.safe_load(ray_service()["spec"]["serveConfigV2"])["applications"]
    edits: list[Callable[[dict[str, Any]], object]] = [
        lambda a: a["args"].update(extra=1),
        lambda a: a.update(import_path="x:y"),
        lambda a: a["deployments"][0].update(user_config={"wait_s": 9.0}),
        lambda a: a["deployments"][0]["autoscaling_config"].update(max_replicas=7),
        lambda a: a["deployments"][0].update(graceful_shutdown_timeout_s=1.0),
        lambda a: a["deployments"][0]["autoscaling_config"].update(
            policy={"policy_function": "ray.serve.autoscaling_policy:default_autoscaling_policy"}
        ),
        lambda a: a["deployments"][0].update(
            request_router_config={
                "request_router_class": "ray.serve._private.request_router:PowerOfTwoChoicesRequestRouter"
            }
        ),
        lambda a: a.update(runtime_env={"env_vars": {"A": "1"}}),
    ]
    variants = []
    for app in base:
        for edit in edits:
            changed = json.loads(json.dumps(app))
            edit(changed)
            variants.append((app, changed))
    apps = [a for pair in variants for a in pair]
    ran = subprocess.run([str(RAY_PYTHON), "-c", _CODE_VERSION_PROBE], input=json.dumps(apps),
                         capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
    hashes = json.loads(ran.stdout)
    ray_moved = [hashes[2 * i] != hashes[2 * i + 1] for i in range(len(variants))]
    ours = [code_version(a) != code_version(b) for a, b in variants]
    assert ours == ray_moved
    assert ray_moved.count(True) == 5 * len(base)  # args, import path, policy, router, runtime env
    # The check can fail: without the overrides' policies it misses one kind of restart.
    blind = [{k: v for k, v in code_version(a).items() if k != "deployment_autoscaling_policies"} for a, _ in variants]
    blind_b = [
        {k: v for k, v in code_version(b).items() if k != "deployment_autoscaling_policies"} for _, b in variants
    ]
    assert [x != y for x, y in zip(blind, blind_b, strict=True)] != ray_moved
