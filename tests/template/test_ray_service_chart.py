"""The cdk8s RayService: the fields that matter, one snapshot, and the KubeRay CRD schema."""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from kuberay_schema import load_crd_schema, schema_errors
from support import DENSE, RAY_IMAGE, ROOT, SHARED, STAGED_URI, ray_service, render, serve_args

from eks_pd_serving import versions
from eks_pd_serving.k8s.ray_service import POD_SECURITY_LABELS

SNAPSHOT = ROOT / "tests" / "__snapshots__" / "ray_service.yaml"
CRD_DIR = SHARED / "kuberay" / f"v{versions.KUBERAY_VERSION}"


@pytest.fixture(scope="module")
def default_service() -> dict[str, Any]:
    return ray_service()


def test_namespace_and_name_are_explicit(default_service: dict[str, Any]) -> None:
    namespace, workers, head, _code, _guard, _failover, _node_cache, service = render()
    # The pods' service accounts exist in every configuration: a flipped setting never drops one
    # from the manifest (kubectl's prune would leave it in the cluster).
    assert [(a["kind"], a["metadata"]["name"]) for a in (workers, head)] == [
        ("ServiceAccount", "ray-llm-workers"),
        ("ServiceAccount", "ray-llm-head"),
    ]
    assert namespace == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "inference", "labels": POD_SECURITY_LABELS},
    }
    assert service["apiVersion"] == "ray.io/v1"
    assert service["metadata"] == {"name": "ray-llm", "namespace": "inference"}
    renamed = ray_service(namespace="llm", ray_service_name="qwen")
    assert renamed["metadata"] == {"name": "qwen", "namespace": "llm"}


def test_each_phase_is_its_own_application_and_the_ingress_is_pd_openai_on_root(
    default_service: dict[str, Any],
) -> None:
    apps = yaml.safe_load(default_service["spec"]["serveConfigV2"])["applications"]
    assert [(a["name"], a["import_path"], a["route_prefix"]) for a in apps] == [
        ("pd-prefill", "eks_pd_failover:build_prefill_app", None),
        ("pd-decode", "eks_pd_failover:build_decode_app", None),
        ("pd-openai", "eks_pd_failover:build_ingress_app", "/"),
    ]
    prefill, decode, ingress = apps
    assert set(prefill["args"]) == {"llm_config", "pair", "covered"}
    assert set(decode["args"]) == {"llm_config", "pair", "prefill", "covered"}
    assert decode["args"]["prefill"] == {"app": "pd-prefill", "deployment": "Prefill:qwen3_5-9b"}
    assert prefill["args"]["pair"] == decode["args"]["pair"]  # one model, one weight format: paired
    (model,) = ingress["args"]["models"]
    assert model == {
        "model_id": "qwen3.5-9b",
        "max_model_len": 4096,
        "adapters": False,
        "decode": {"app": "pd-decode", "deployment": "Decode:qwen3_5-9b"},
        "prefill": {"app": "pd-prefill", "deployment": "Prefill:qwen3_5-9b"},
    }
    # What Serve applies without a restart sits in the overrides, never in the args: replicas (as
    # autoscaling bounds, fixed or not), timing, and the failover's settings as user_config.
    (ingress_options,) = ingress["deployments"]
    assert ingress_options["autoscaling_config"] == {"min_replicas": 2, "max_replicas": 2, "initial_replicas": 2}
    settings = {"wait_s": 2.0, "prefill_timeout_s": 30.0, "short_prompt_tokens": 128}  # each default written out
    assert ingress_options["user_config"] == decode["deployments"][0]["user_config"] == settings
    assert "user_config" not in prefill["deployments"][0]


def test_without_failover_the_app_is_rays_own_builder_and_the_code_still_ships() -> None:
    from eks_pd_serving.fault_tolerance import failover

    objects = render(pd_failover=False)
    (service,) = [o for o in objects if o["kind"] == "RayService"]
    (app,) = yaml.safe_load(service["spec"]["serveConfigV2"])["applications"]
    assert app["import_path"] == "ray.serve.llm:build_pd_openai_app"
    assert set(app["args"]) == {"prefill_config", "decode_config"}
    # Shipped and mounted in both settings: turning failover on again is a serve-config change only.
    assert [o for o in objects if o["kind"] == "ConfigMap" and failover.FILE_NAME in o["data"]]
    assert service["spec"]["rayClusterConfig"] == ray_service()["spec"]["rayClusterConfig"]


def test_the_failover_settings_reach_the_builders_args() -> None:
    args = serve_args(ray_service(failover_wait_s=0.5, failover_prefill_timeout_s=12, short_prompt_tokens=64))
    assert args["failover"] == {"wait_s": 0.5, "prefill_timeout_s": 12.0, "short_prompt_tokens": 64}


def test_the_head_and_every_worker_mount_the_failover_code_on_their_pythonpath() -> None:
    """The application is built, and its ingress may run, on any Ray pod: the head's too."""
    from eks_pd_serving.fault_tolerance import failover

    objects = render(api_keys=True)
    (config_map,) = [o for o in objects if o["kind"] == "ConfigMap" and failover.FILE_NAME in o["data"]]
    assert config_map["metadata"]["name"] == "ray-llm-failover-code"
    assert config_map["data"][failover.FILE_NAME] == failover.source()
    (service,) = [o for o in objects if o["kind"] == "RayService"]
    cluster = service["spec"]["rayClusterConfig"]
    templates = [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]
    for template in templates:
        assert template["metadata"]["annotations"]["eks-pd-serving/failover-code"] == failover.source_digest()
        (container,) = template["spec"]["containers"]
        assert failover.MOUNT_PATH in {m["mountPath"] for m in container["volumeMounts"]}
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert failover.MOUNT_PATH in env["PYTHONPATH"].split(":")
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        assert volumes["failover-code"]["configMap"] == {"name": "ray-llm-failover-code"}


def test_a_failover_setting_without_failover_is_refused() -> None:
    from eks_pd_serving.config import ConfigError

    with pytest.raises(ConfigError, match="short_prompt_tokens=64 has no effect with pd_failover=false"):
        ray_service(pd_failover=False, short_prompt_tokens=64)
    with pytest.raises(ConfigError, match="short_prompt_tokens=4096 is not under max_model_len=4096"):
        ray_service(short_prompt_tokens=4096)


@pytest.mark.parametrize(("phase", "role"), [("prefill", "kv_producer"), ("decode", "kv_consumer")])
def test_each_engine_moves_kv_with_nixl_over_libfabric(default_service: dict[str, Any], phase: str, role: str) -> None:
    config = serve_args(default_service)[f"{phase}_config"]
    assert "kv_transfer_config" not in config  # Ray 2.5x rejects it beside engine_kwargs
    # The defaults stage the weights and keep the node cache: the engines read the node's copy,
    # filled from the staged revision before each start.
    folder = "/var/cache/eks-pd/weights/Qwen--Qwen3.5-9B/main"
    assert config["model_loading_config"] == {"model_id": "qwen3.5-9b", "model_source": folder}
    assert config["callback_config"]["callback_kwargs"]["source"] == STAGED_URI
    assert config["deployment_config"] == {}
    assert serve_args(default_service)[f"{phase}_deployment"] == {
        "name": f"{phase.title()}:qwen3_5-9b",
        "autoscaling_config": {"min_replicas": 1, "max_replicas": 1, "initial_replicas": 1},
        "graceful_shutdown_timeout_s": 300.0,
        "health_check_period_s": 10.0,
        "health_check_timeout_s": 10.0,
        **({"user_config": serve_args(default_service)["failover"]} if phase == "decode" else {}),
    }
    # Each phase's NIXL side channels from a port range of its own (one pod may hold both).
    assert config["experimental_configs"] == {"NIXL_SIDE_CHANNEL_PORT_BASE": {"prefill": 20000, "decode": 21000}[phase]}
    engine = config["engine_kwargs"]
    assert {k: engine[k] for k in ("max_model_len", "dtype", "gpu_memory_utilization", "enforce_eager")} == {
        "max_model_len": 4096,
        "dtype": "bfloat16",
        "gpu_memory_utilization": 0.9,
        "enforce_eager": True,
    }
    assert engine["tensor_parallel_size"] == 1
    assert engine["kv_transfer_config"] == {
        "kv_connector": "NixlConnector",
        "kv_role": role,
        "kv_buffer_device": "cuda",
        "kv_connector_extra_config": {"backends": ["LIBFABRIC"]},
        # Only decode loads KV; the default model is hybrid (vLLM's V1 runner): recompute.
        **({"kv_load_failure_policy": "recompute"} if phase == "decode" else {}),
    }


def test_per_phase_settings_reach_their_engine() -> None:
    args = serve_args(
        ray_service(
            gpu_instance_type="g6.12xlarge",
            **DENSE,
            prefill_replicas=2,
            decode_tensor_parallel_size=2,
            decode_enforce_eager="false",
            kv_buffer_device="cpu",
            kv_backend="UCX",
        )
    )
    prefill, decode = args["prefill_config"], args["decode_config"]
    assert args["prefill_deployment"]["autoscaling_config"]["max_replicas"] == 2
    assert (
        prefill["engine_kwargs"]["tensor_parallel_size"],
        decode["engine_kwargs"]["tensor_parallel_size"],
    ) == (1, 2)
    assert (prefill["engine_kwargs"]["enforce_eager"], decode["engine_kwargs"]["enforce_eager"]) == (
        True,
        False,
    )
    for side in (prefill, decode):
        kv = side["engine_kwargs"]["kv_transfer_config"]
        assert (kv["kv_buffer_device"], kv["kv_connector_extra_config"]) == ("cpu", {"backends": ["UCX"]})


def test_head_is_cpu_only_on_system_nodes(default_service: dict[str, Any]) -> None:
    cluster = default_service["spec"]["rayClusterConfig"]
    assert cluster["rayVersion"] == versions.RAY_VERSION
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0"
    assert head["serviceType"] == "ClusterIP"
    spec = head["template"]["spec"]
    assert spec["nodeSelector"] == {"role": "system"}
    (container,) = spec["containers"]
    assert container["image"] == RAY_IMAGE
    assert "nvidia.com/gpu" not in container["resources"]["limits"]


def test_workers_take_a_whole_gpu_node_with_efa(default_service: dict[str, Any]) -> None:
    (group,) = default_service["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (2, 2, 2)
    spec = group["template"]["spec"]
    assert spec["nodeSelector"] == {"role": "gpu-worker"}
    (container,) = spec["containers"]
    assert container["image"] == RAY_IMAGE
    # Unprivileged: the EFA device from the device plugin, IPC_LOCK to register memory with it.
    assert container["securityContext"] == {
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "capabilities": {"add": ["IPC_LOCK"]},
    }
    limits = container["resources"]["limits"]
    assert (limits["nvidia.com/gpu"], limits["vpc.amazonaws.com/efa"]) == (1, 1)
    # g6.8xlarge: 32 vCPUs, 128 GiB; the pod leaves 4 vCPUs and a fifth of memory to the node,
    # and its limit stays far above the 18 GiB checkpoint so the page cache can keep it.
    assert (limits["cpu"], limits["memory"]) == ("28", "102Gi")
    assert container["resources"]["requests"] == {"cpu": "28", "memory": "102Gi"}
    env = {e["name"]: e for e in container["env"]}
    assert env["FI_PROVIDER"]["value"] == "efa"
    assert env["RAY_LOG_TO_STDERR"]["value"] == "1"  # engine lines in the pod log, not /tmp/ray files
    assert env["VLLM_HOST_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["VLLM_SSM_CONV_STATE_LAYOUT"]["value"] == "DS"
    # The proxy checks' code (the body's bound, always), the KV guard's and the failover's code, mounted
    # whether each is on or off (RayServiceProps.kv_guard_program, failover_program); the node cache's
    # code and the node's disk.
    assert container["volumeMounts"] == [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "api-keys-code", "mountPath": "/opt/eks-pd/python", "readOnly": True},
        {"name": "kv-guard-code", "mountPath": "/opt/eks-pd/kv-guard", "readOnly": True},
        {"name": "failover-code", "mountPath": "/opt/eks-pd/failover", "readOnly": True},
        {"name": "node-cache-code", "mountPath": "/opt/eks-pd/node-cache", "readOnly": True},
        {"name": "node-cache", "mountPath": "/var/cache/eks-pd"},
    ]
    assert spec["volumes"] == [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "25Gi"}},
        {"name": "api-keys-code", "configMap": {"name": "ray-llm-api-keys-code"}},
        {"name": "kv-guard-code", "configMap": {"name": "ray-llm-kv-guard-code"}},
        {"name": "failover-code", "configMap": {"name": "ray-llm-failover-code"}},
        {"name": "node-cache-code", "configMap": {"name": "ray-llm-node-cache-code"}},
        {"name": "node-cache", "hostPath": {"path": "/mnt/k8s-disks/0/eks-pd-serving", "type": "DirectoryOrCreate"}},
    ]
    assert (
        env["PYTHONPATH"]["value"]
        == "/opt/eks-pd/python:/opt/eks-pd/kv-guard:/opt/eks-pd/failover:/opt/eks-pd/node-cache"
    )


def test_dense_models_do_not_get_the_hybrid_layout() -> None:
    (group,) = ray_service(**DENSE)["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    names = {e["name"] for e in group["template"]["spec"]["containers"][0]["env"]}
    assert "VLLM_SSM_CONV_STATE_LAYOUT" not in names


def test_nothing_asks_kubernetes_for_a_load_balancer() -> None:
    assert "LoadBalancer" not in yaml.safe_dump(render())


def test_snapshot_of_the_whole_manifest() -> None:
    # A token's text carries a counter of the tokens the process made before it (``AWS.Region.9``),
    # which other tests in the same worker move: the snapshot holds the token's name alone.
    rendered = re.sub(
        r"\$\{Token\[([A-Za-z.]+?)\.\d+\]\}", r"${Token[\1]}", yaml.safe_dump_all(render(), sort_keys=True)
    )
    if os.environ.get("UPDATE_SNAPSHOTS") or not SNAPSHOT.exists():
        SNAPSHOT.write_text(rendered)
    assert rendered == SNAPSHOT.read_text(), "manifest changed: review, then UPDATE_SNAPSHOTS=1 make test"


# --- KubeRay CRD schema -------------------------------------------------------------------
needs_crd = pytest.mark.skipif(
    not CRD_DIR.is_dir(),
    reason=f"KubeRay CRDs not found at {CRD_DIR} (../shared is beside the checkout in CI)",
)


@pytest.fixture(scope="module")
def crd_schema() -> dict[str, Any]:
    return load_crd_schema(CRD_DIR / "ray.io_rayservices.yaml")


@needs_crd
def test_chart_and_crd_are_the_same_kuberay_release() -> None:
    chart = yaml.safe_load((CRD_DIR / "Chart.yaml").read_text())
    assert (chart["name"], chart["version"]) == ("kuberay-operator", versions.KUBERAY_VERSION)


@needs_crd
@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"gpu_instance_type": "g6.12xlarge", **DENSE, "decode_tensor_parallel_size": 2},
        {"autoscaling": True, "gpu_layout": "per_phase", "prefill_min_replicas": 0},
    ],
    ids=["default", "multi-gpu", "autoscaling"],
)
def test_ray_service_matches_the_kuberay_crd(crd_schema: dict[str, Any], settings: dict[str, Any]) -> None:
    assert schema_errors(crd_schema, ray_service(**settings)) == []


BROKEN: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    (
        "misspelt field",
        lambda s: s["spec"]["rayClusterConfig"]["headGroupSpec"].update(rayStartParam={}),
        "Additional properties are not allowed",
    ),
    (
        "wrong type",
        lambda s: s["spec"]["rayClusterConfig"]["workerGroupSpecs"][0].update(replicas="two"),
        "'two' is not of type 'integer'",
    ),
    (
        "autoscaler option misspelt",
        lambda s: s["spec"]["rayClusterConfig"].update(autoscalerOptions={"idleTimeoutSecond": 60}),
        "Additional properties are not allowed",
    ),
    (
        "unknown upscaling mode",
        lambda s: s["spec"]["rayClusterConfig"].update(autoscalerOptions={"upscalingMode": "Fast"}),
        "'Fast' is not one of",
    ),
    (
        "missing required",
        lambda s: s["spec"]["rayClusterConfig"]["headGroupSpec"].pop("template"),
        "'template' is a required",
    ),
]


@needs_crd
@pytest.mark.parametrize(("_name", "breakage", "message"), BROKEN, ids=[b[0] for b in BROKEN])
def test_schema_check_fails_on_a_broken_manifest(
    crd_schema: dict[str, Any],
    default_service: dict[str, Any],
    _name: str,
    breakage: Callable[[dict[str, Any]], None],
    message: str,
) -> None:
    broken = copy.deepcopy(default_service)
    breakage(broken)
    assert any(message in e for e in schema_errors(crd_schema, broken))


# --- the KV guard ----------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["auto", "on", "off"])
def test_the_gpu_workers_name_the_kv_guards_engine_beside_its_mounted_code(mode: str) -> None:
    """The engine class is in the workers' env, not decode's runtime_env: env and mount change
    together with the RayCluster. In the serve config alone, an update would restart decode's
    replicas in pods that do not mount the code yet, and they would fail to import it."""
    from eks_pd_serving.fault_tolerance import kv_guard

    objects = render(kv_pull_guard=mode)
    (service,) = [o for o in objects if o["kind"] == "RayService"]
    args = serve_args(service)
    assert "runtime_env" not in args["decode_config"] and "runtime_env" not in args["prefill_config"]
    # The code ships in every mode, beside the namespace (not in the RayService's manifest).
    (config_map,) = [o for o in objects if o["kind"] == "ConfigMap" and kv_guard.FILE_NAME in o["data"]]
    assert config_map["data"][kv_guard.FILE_NAME] == kv_guard.source()
    for group in service["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
        template = group["template"]
        assert template["metadata"]["annotations"]["eks-pd-serving/kv-guard-code"] == kv_guard.source_digest()
        (container,) = template["spec"]["containers"]
        assert kv_guard.MOUNT_PATH in {m["mountPath"] for m in container["volumeMounts"]}
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert kv_guard.MOUNT_PATH in env["PYTHONPATH"].split(":")
        named = {k: env.get(k) for k in ("RAYLLM_VLLM_ENGINE_CLS", "EKS_PD_KV_GUARD")}
        on = {"RAYLLM_VLLM_ENGINE_CLS": "eks_pd_kv_guard:KvGuardEngine", "EKS_PD_KV_GUARD": mode}
        assert named == ({"RAYLLM_VLLM_ENGINE_CLS": None, "EKS_PD_KV_GUARD": None} if mode == "off" else on)
    head = service["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert kv_guard.MOUNT_PATH not in {m["mountPath"] for m in head["volumeMounts"]}


def test_no_engine_has_a_fixed_nixl_engine_id() -> None:
    """A fixed id made a restarted prefill on the same pod the dead peer's namesake, which decode
    kept; Ray's NIXL backend gives each start a fresh one when none is set."""
    args = serve_args(ray_service())
    for side in ("prefill_config", "decode_config"):
        assert "engine_id" not in args[side]["engine_kwargs"]["kv_transfer_config"]


def test_a_max_model_len_change_within_the_body_bound_changes_no_pod() -> None:
    """The proxies' bound is its own setting, not derived in the pod template from max_model_len."""
    clusters = [ray_service(max_model_len=n)["spec"]["rayClusterConfig"] for n in (2048, 4096, 8192)]
    assert clusters[0] == clusters[1] == clusters[2]


def test_gpu_worker_privileged_restores_a_privileged_worker() -> None:
    (group,) = ray_service(gpu_worker_privileged=True)["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    (container,) = group["template"]["spec"]["containers"]
    assert container["securityContext"] == {"privileged": True}


def _containers(service: dict[str, Any]) -> list[dict[str, Any]]:
    cluster = service["spec"]["rayClusterConfig"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    return [g["template"]["spec"]["containers"][0] for g in groups]


@pytest.mark.parametrize("settings", [{}, {"endpoint_exposure": "internal"}, {"max_request_body_mib": 64}])
def test_every_serve_proxy_bounds_the_body_with_or_without_api_keys(settings: dict[str, Any]) -> None:
    """The proxy hook is on every Ray pod, keys or none, with max_request_body_mib (default 16)."""
    service = ray_service(**settings)
    for container in _containers(service):
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"] == "eks_pd_api_keys:middlewares"
        assert env["EKS_PD_MAX_BODY_BYTES"] == str(settings.get("max_request_body_mib", 16) * 2**20)
        assert ("EKS_PD_API_KEYS_SECRET" in env) == (settings.get("endpoint_exposure") == "internal")
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert env["PYTHONPATH"].split(":")[0] in mounts  # the hook's code is mounted where it is imported


def test_request_templates_are_trusted_only_when_set() -> None:
    """Off (the default): no engine trusts a request's template and the ingress refuses one. On: both
    engines get vLLM's flag and the ingress lets it through; the phases' pair key is unchanged."""
    off, on = (
        yaml.safe_load(ray_service(**s)["spec"]["serveConfigV2"]) for s in ({}, {"trust_request_chat_template": True})
    )
    for config, trusted in ((off, False), (on, True)):
        for app in config["applications"]:
            if "llm_config" in app["args"]:
                assert app["args"]["llm_config"]["engine_kwargs"].get("trust_request_chat_template", False) is trusted
            else:
                (model,) = app["args"]["models"]
                assert model.get("trust_request_chat_template", False) is trusted
    pairs = [{a["name"]: a["args"].get("pair") for a in c["applications"]} for c in (off, on)]
    assert pairs[0] == pairs[1]


def test_the_hub_revision_reaches_both_engines_when_they_load_from_the_hub() -> None:
    """weights_source=huggingface: vLLM's ``revision`` on both engines, so a commit hash pins what is
    served (without it each engine loads the Hub's default branch at its own start). Staged weights
    (the default) hold one revision already: no ``revision``."""
    from eks_pd_serving.config import DeploymentConfig
    from eks_pd_serving.mapping import served_model

    hub = serve_args(ray_service(weights_source="huggingface", model_revision="0123abcd"))
    for phase in ("prefill", "decode"):
        assert hub[f"{phase}_config"]["engine_kwargs"]["revision"] == "0123abcd"
    staged = serve_args(ray_service(model_revision="0123abcd"))
    for phase in ("prefill", "decode"):
        assert "revision" not in staged[f"{phase}_config"]["engine_kwargs"]
    # The value holds the revision either way; where it is written is decided when rendered.
    weights = served_model(DeploymentConfig.create(model_revision="0123abcd"), "s3://weights/models/x/0123abcd")
    assert weights.model.weights.revision == "0123abcd"
