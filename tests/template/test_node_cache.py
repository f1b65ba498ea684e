"""What the GPU nodes keep between two starts: nodeadm's configuration in the GPU launch template
(FastImagePull, the instance store as one RAID0 array), the worker pods' mount of the node's disk,
the engines loading the node's copy of the staged weights through the fill callback, and the compile
caches in a folder keyed by the image."""

from __future__ import annotations

from typing import Any

import cdk8s
import pytest
import yaml
from aws_cdk.assertions import Template
from support import RAY_IMAGE, build_stack, resources_of_type

from eks_pd_serving.config import DeploymentConfig
from eks_pd_serving.k8s import RayServiceChart
from eks_pd_serving.k8s import serve_config as layout
from eks_pd_serving.mapping import ray_service_props
from eks_pd_serving.phase import PHASES, Phase
from eks_pd_serving.weights import node_cache

WEIGHTS_URI = "s3://model-weights/models/Qwen/Qwen3.5-9B/main"


def gpu_launch_template_data(**settings: Any) -> dict[str, Any]:
    template = dict(Template.from_stack(build_stack(**settings)).to_json())
    templates = resources_of_type(template, "AWS::EC2::LaunchTemplate").values()
    (data,) = [lt["Properties"]["LaunchTemplateData"] for lt in templates
               if "NetworkInterfaces" in lt["Properties"]["LaunchTemplateData"]]  # fmt: skip
    return dict(data)


def node_config(data: dict[str, Any]) -> dict[str, Any] | None:
    """The NodeConfig in the launch template's MIME user data (Fn::Base64 of the text)."""
    if "UserData" not in data:
        return None
    text = data["UserData"]["Fn::Base64"]
    head, part = text.split("Content-Type: application/node.eks.aws\n\n", 1)
    assert 'Content-Type: multipart/mixed; boundary="EKSPDSERVING"' in head
    return dict(yaml.safe_load(part.split("\n--EKSPDSERVING--")[0]))


def test_gpu_nodes_pull_in_parallel_and_raid_the_instance_store() -> None:
    data = gpu_launch_template_data()
    assert node_config(data) == {
        "apiVersion": "node.eks.aws/v1alpha1",
        "kind": "NodeConfig",
        "spec": {"featureGates": {"FastImagePull": True}, "instance": {"localStorage": {"strategy": "RAID0"}}},
    }
    (root,) = data["BlockDeviceMappings"]
    # The pull writes to the instance store's array (g6.8xlarge: 900 GB), not the root volume: gp3's
    # included 125 MiB/s, nothing provisioned.
    assert "Throughput" not in root["Ebs"] and root["Ebs"]["VolumeType"] == "gp3"


@pytest.mark.parametrize(
    ("settings", "spec", "throughput"),
    [
        ({"fast_image_pull": False}, {"instance": {"localStorage": {"strategy": "RAID0"}}}, None),
        ({"node_cache": False}, {"featureGates": {"FastImagePull": True}}, 600),
        ({"fast_image_pull": False, "node_cache": False}, None, None),
    ],
)
def test_each_node_option_turns_off_alone(settings: dict[str, Any], spec: Any, throughput: int | None) -> None:
    data = gpu_launch_template_data(**settings)
    found = node_config(data)
    assert (found and found["spec"]) == spec
    assert data["BlockDeviceMappings"][0]["Ebs"].get("Throughput") == throughput


def test_the_root_volume_is_raised_only_where_the_pull_writes_to_it() -> None:
    from eks_pd_serving._private import launch_template

    throughput = {
        (fast, local, store): launch_template.root_throughput(
            fast_image_pull=fast, local_storage=local, instance_store_gb=store
        )
        for fast in (True, False) for local in (True, False) for store in (0, 900)
    }  # fmt: skip
    raised = {k for k, v in throughput.items() if v == 600}
    # FastImagePull writing to the root volume: no localStorage, or a type without an instance store.
    assert raised == {(True, False, 0), (True, False, 900), (True, True, 0)}
    assert {v for k, v in throughput.items() if k not in raised} == {None}


def worker(service: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    (group, *_) = service["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    (container,) = group["template"]["spec"]["containers"]
    return group["template"]["spec"], container


def rendered(weights_uri: str | None = WEIGHTS_URI, image: str = RAY_IMAGE, **settings: Any) -> dict[str, Any]:
    props = ray_service_props(DeploymentConfig.create(**settings), image, weights_uri=weights_uri)
    documents = cdk8s.Testing.synth(RayServiceChart(cdk8s.App(), "RayService", props=props))
    (service,) = [d for d in documents if d["kind"] == "RayService"]
    return dict(service)


def test_engines_load_the_nodes_copy_filled_from_the_staged_weights() -> None:
    service = rendered()
    config = yaml.safe_load(service["spec"]["serveConfigV2"])
    folder = f"{node_cache.CACHE_PATH}/weights/Qwen--Qwen3.5-9B/main"
    for phase in PHASES:
        llm = layout.llm_config(config, phase)
        assert llm["model_loading_config"]["model_source"] == folder
        assert llm["callback_config"] == {
            "callback_class": "eks_pd_node_cache:NodeWeights",
            "callback_kwargs": {"source": WEIGHTS_URI, "compiled": compiled_keys(service)[phase]},
        }
    spec, container = worker(service)
    assert {"name": "node-cache", "hostPath": {"path": node_cache.HOST_PATH, "type": "DirectoryOrCreate"}} in spec[
        "volumes"
    ]
    assert {"name": "node-cache", "mountPath": node_cache.CACHE_PATH} in container["volumeMounts"]
    python_path = next(e["value"] for e in container["env"] if e["name"] == "PYTHONPATH").split(":")
    assert node_cache.MOUNT_PATH in python_path


def compile_env(service: dict[str, Any]) -> dict[str, str]:
    _, container = worker(service)
    names = ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "HF_HUB_CACHE")
    return {e["name"]: e["value"] for e in container["env"] if e["name"] in names}


def test_compile_caches_are_keyed_by_the_image() -> None:
    env = compile_env(rendered())
    key = node_cache.compile_key(RAY_IMAGE)
    assert env == {
        "VLLM_CACHE_ROOT": f"{node_cache.CACHE_PATH}/compile/{key}/vllm",
        "TORCHINDUCTOR_CACHE_DIR": f"{node_cache.CACHE_PATH}/compile/{key}/inductor",
        "TRITON_CACHE_DIR": f"{node_cache.CACHE_PATH}/compile/{key}/triton",
    }
    other = compile_env(rendered(image=RAY_IMAGE + "-next"))
    assert all(other[name] != value for name, value in env.items())
    # Not of the registry's host: synth may hold its region as a token, whose text varies.
    assert node_cache.compile_key(RAY_IMAGE.replace("us-east-1", "${Token[AWS.Region.12]}")) == key


def test_weights_from_the_hub_keep_the_hubs_cache_on_the_node() -> None:
    service = rendered(weights_uri=None, weights_source="huggingface")
    llm = layout.llm_config(yaml.safe_load(service["spec"]["serveConfigV2"]), Phase.DECODE)
    assert llm["model_loading_config"]["model_source"] == "Qwen/Qwen3.5-9B" and "callback_config" not in llm
    assert compile_env(service)["HF_HUB_CACHE"] == f"{node_cache.CACHE_PATH}/huggingface"


def test_without_the_node_cache_the_engines_read_s3_as_before() -> None:
    service = rendered(node_cache=False)
    llm = layout.llm_config(yaml.safe_load(service["spec"]["serveConfigV2"]), Phase.DECODE)
    assert llm["model_loading_config"]["model_source"] == WEIGHTS_URI and "callback_config" not in llm
    spec, _ = worker(service)
    assert compile_env(service) == {} and all("hostPath" not in v for v in spec["volumes"])


def compiled_keys(service: dict[str, Any]) -> dict[Phase, str | None]:
    """Each engine's compile archive in its weights' bucket (None: not shared)."""
    config = yaml.safe_load(service["spec"]["serveConfigV2"])
    found = {}
    for phase in PHASES:
        callback = layout.llm_config(config, phase).get("callback_config") or {}
        found[phase] = callback.get("callback_kwargs", {}).get("compiled")
    return found


def test_each_engine_shares_its_compile_caches_under_its_image_and_settings() -> None:
    keys = compiled_keys(rendered())
    prefix = f"compile/{node_cache.compile_key(RAY_IMAGE)}/"
    assert all(str(k).startswith(prefix) and str(k).endswith(".tar.gz") for k in keys.values())
    assert keys[Phase.PREFILL] != keys[Phase.DECODE]  # each engine's own settings
    changed = compiled_keys(rendered(decode_max_num_seqs=4))
    assert changed[Phase.PREFILL] == keys[Phase.PREFILL] and changed[Phase.DECODE] != keys[Phase.DECODE]
    other_image = compiled_keys(rendered(image=RAY_IMAGE + "-next"))
    assert all(not str(k).startswith(prefix) for k in other_image.values())
    assert compiled_keys(rendered()) == keys  # deterministic: the same settings give the same keys


@pytest.mark.parametrize(
    "settings",
    [{"shared_compile_cache": False}, {"node_cache": False}, {"weights_uri": None, "weights_source": "huggingface"}],
)
def test_compile_caches_are_shared_only_with_the_setting_the_node_cache_and_the_bucket(
    settings: dict[str, Any],
) -> None:
    assert set(compiled_keys(rendered(**settings)).values()) == {None}


def _worker_statements(template: dict[str, Any]) -> list[dict[str, Any]]:
    associations = resources_of_type(template, "AWS::EKS::PodIdentityAssociation").values()
    (role,) = [a["Properties"]["RoleArn"]["Fn::GetAtt"][0] for a in associations
               if a["Properties"]["ServiceAccount"] == "ray-llm-workers"]  # fmt: skip
    policies = [p["Properties"] for p in resources_of_type(template, "AWS::IAM::Policy").values()]
    return [s for p in policies if {"Ref": role} in p["Roles"] for s in p["PolicyDocument"]["Statement"]]


def _writes(statements: list[dict[str, Any]]) -> list[Any]:
    return [s["Resource"] for s in statements if "s3:PutObject" in s["Action"]]


def test_workers_write_only_compile_archives_and_only_with_the_setting() -> None:
    template = dict(Template.from_stack(build_stack()).to_json())
    (resource,) = _writes(_worker_statements(template))
    assert resource["Fn::Join"][1][-1] == "/compile/*"
    (bucket,) = resources_of_type(template, "AWS::S3::Bucket").values()
    assert bucket["Properties"]["LifecycleConfiguration"]["Rules"] == [
        {"Id": "CompileCaches", "Prefix": "compile/", "ExpirationInDays": 30, "Status": "Enabled"}
    ]
    off = dict(Template.from_stack(build_stack(shared_compile_cache=False)).to_json())
    assert _writes(_worker_statements(off)) == []
    (bucket,) = resources_of_type(off, "AWS::S3::Bucket").values()
    assert "LifecycleConfiguration" not in bucket["Properties"]
