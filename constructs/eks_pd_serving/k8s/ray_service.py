"""The RayService chart: a CPU-only Ray head and GPU workers running the P/D serve app.

Every field is built from the typed props below; the KubeRay CRD schema test catches drift
between these fields and the CRD version the operator installs.
"""

from __future__ import annotations

from typing import Any

import cdk8s
import cdk8s_plus_35 as kplus
from constructs import Construct

from . import gpu_accounting
from .serve_config import build_serve_config, to_yaml
from .specs import (
    DASHBOARD_PORT,
    SERVE_PORT,
    GcsFaultToleranceSpec,
    InitProgram,
    NodeCacheSpec,
    PodProgram,
    PodResources,
    RayAutoscalerSpec,
    RayServiceProps,
    WorkerGroupSpec,
)

SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"
LOG_TO_STDERR = "RAY_LOG_TO_STDERR"
# The volumes the pods' programs (RayServiceProps: api_keys_hook, kv_guard_program) are mounted from.
_API_KEYS_VOLUME = "api-keys-code"
_KV_GUARD_VOLUME = "kv-guard-code"
_FAILOVER_VOLUME = "failover-code"
_NODE_CACHE_CODE_VOLUME = "node-cache-code"
_NODE_CACHE_VOLUME = "node-cache"

# Pod Security Admission: the Ray workers add IPC_LOCK and mount the node's disk (a hostPath), both
# beyond baseline, so the namespace admits them; warn and audit show anything beyond baseline to
# whoever creates pods here.
POD_SECURITY_LABELS = {
    "pod-security.kubernetes.io/enforce": "privileged",
    "pod-security.kubernetes.io/warn": "baseline",
    "pod-security.kubernetes.io/audit": "baseline",
}


class RayNamespaceChart(cdk8s.Chart):
    """What the Ray pods run in and mount: the namespace, the service accounts and the pods' code
    (the key check's, the KV guard's, the failover's, the node cache's, the rollout Jobs'). A
    manifest of its own, deleted after the RayService's: KubeRay's Redis cleanup Job (behind the
    RayCluster's finalizer) is created in this namespace, as the head's service account, while the
    RayService is deleted, and a terminating namespace admits no new pod.

    The key check's ConfigMap is applied whether keys are on or off: a RayCluster built with keys
    mounts it as a non-optional volume, and under ``ray_upgrade_strategy=None`` turning keys off does
    not rebuild that cluster, so pruning it would leave the next Ray pod in FailedMount.
    """

    def __init__(self, scope: Construct, id: str, *, props: RayServiceProps) -> None:
        super().__init__(scope, id, disable_resource_name_hashes=True)
        self.props = props
        cdk8s.ApiObject(
            self,
            "Namespace",
            api_version="v1",
            kind="Namespace",
            metadata=cdk8s.ApiObjectMetadata(name=props.namespace, labels=POD_SECURITY_LABELS),
        )
        for construct_id, account in (
            ("WorkerServiceAccount", props.worker_service_account),
            ("HeadServiceAccount", props.head_service_account),
        ):
            if account:
                cdk8s.ApiObject(
                    self,
                    construct_id,
                    api_version="v1",
                    kind="ServiceAccount",
                    metadata=cdk8s.ApiObjectMetadata(name=account, namespace=props.namespace),
                )
        for construct_id, program in (
            ("ApiKeysCode", props.api_keys_hook.program if props.api_keys_hook else None),
            ("KvGuardCode", props.kv_guard_program),
            ("FailoverCode", props.failover_program),
            ("NodeCacheCode", props.node_cache_program),
            ("RolloutCode", props.rollout_program),
        ):
            if program is not None:
                kplus.ConfigMap(
                    self,
                    construct_id,
                    metadata=cdk8s.ApiObjectMetadata(name=program.config_map, namespace=props.namespace),
                    data={program.file_name: program.source},
                )


class RayServiceChart(cdk8s.Chart):
    """The RayService alone (its namespace and what its pods mount are ``RayNamespaceChart``'s)."""

    def __init__(
        self, scope: Construct, id: str, *, props: RayServiceProps, annotations: dict[str, str] | None = None
    ) -> None:
        """``annotations``: the RayService's own (KubeRay copies them onto each RayCluster it
        creates). Default: none."""
        super().__init__(scope, id, disable_resource_name_hashes=True)
        self.props = props
        service = cdk8s.ApiObject(
            self,
            "RayService",
            api_version="ray.io/v1",
            kind="RayService",
            metadata=cdk8s.ApiObjectMetadata(name=props.name, namespace=props.namespace, annotations=annotations),
        )
        service.add_json_patch(cdk8s.JsonPatch.add("/spec", ray_service_spec(props)))


def _api_keys_env(props: RayServiceProps, python_path: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Every Serve proxy (one per Ray pod) loads the checks: the body's bound and, when on, the API
    keys; none of this is a key. ``python_path``: the pod's other program folders, which share the
    one PYTHONPATH."""
    keys, hook, limit = props.api_keys, props.api_keys_hook, props.max_body_bytes
    if keys is None and limit is None:
        return _python_path(python_path)
    if hook is None:
        raise ValueError("RayServiceProps.api_keys and max_body_bytes need api_keys_hook (the checks' code)")
    env = [
        {"name": hook.callback_env, "value": hook.callback},
        *_python_path((hook.program.mount_path, *python_path)),
    ]
    if limit is not None:
        env.append({"name": hook.max_body_env, "value": str(limit)})
    if keys is not None:
        env += [
            {"name": hook.secret_env, "value": keys.secret_arn},
            {"name": hook.refresh_env, "value": str(keys.refresh_s)},
            {"name": hook.max_stale_env, "value": str(keys.max_stale_s)},
        ]
    return env


def _python_path(folders: tuple[str, ...]) -> list[dict[str, Any]]:
    return [{"name": "PYTHONPATH", "value": ":".join(folders)}] if folders else []


def _with_program(program: PodProgram | None, volume: str, pod: dict[str, Any]) -> dict[str, Any]:
    """``pod`` with ``program``'s ConfigMap mounted and its digest annotated."""
    if program is None:
        return pod
    spec = pod["spec"]
    (container,) = spec["containers"]
    container["volumeMounts"] = [
        *container["volumeMounts"],
        {"name": volume, "mountPath": program.mount_path, "readOnly": True},
    ]
    spec["volumes"] = [*spec["volumes"], {"name": volume, "configMap": {"name": program.config_map}}]
    return _annotated(pod, program.annotation, program.digest)


def _with_api_keys(props: RayServiceProps, pod: dict[str, Any]) -> dict[str, Any]:
    """``pod`` (a group's template) with the proxy checks' code mounted and its digest annotated."""
    if (props.api_keys is None and props.max_body_bytes is None) or props.api_keys_hook is None:
        return pod
    return _with_program(props.api_keys_hook.program, _API_KEYS_VOLUME, pod)


def _annotated(pod: dict[str, Any], key: str, digest: str) -> dict[str, Any]:
    """``pod`` with the digest of code it runs as an annotation: new code is a RayCluster change."""
    metadata = pod.setdefault("metadata", {})
    metadata["annotations"] = {**metadata.get("annotations", {}), key: digest}
    return pod


def serve_config_yaml(props: RayServiceProps) -> str:
    return to_yaml(build_serve_config(props.models, props.node_cache))


def ray_service_spec(props: RayServiceProps) -> dict[str, Any]:
    if short := gpu_accounting.shortfall(props):
        raise ValueError(short)
    cluster: dict[str, Any] = {"rayVersion": props.ray_version}
    if props.gcs_fault_tolerance:
        if props.gcs_auth is None:
            raise ValueError("RayServiceProps.gcs_fault_tolerance needs gcs_auth (the token reader)")
        cluster["gcsFaultToleranceOptions"] = _gcs_fault_tolerance(props.gcs_fault_tolerance, props.gcs_auth)
    if props.autoscaler:
        cluster.update(enableInTreeAutoscaling=True, autoscalerOptions=_autoscaler(props.autoscaler))
    cluster.update(
        headGroupSpec=_head_group(props),
        workerGroupSpecs=[_worker_group(props, group) for group in props.workers],
    )
    return {
        "upgradeStrategy": {"type": props.upgrade_strategy},
        "serveConfigV2": serve_config_yaml(props),
        "rayClusterConfig": cluster,
    }


def _gcs_fault_tolerance(spec: GcsFaultToleranceSpec, auth: InitProgram) -> dict[str, Any]:
    """KubeRay sets RAY_REDIS_ADDRESS and REDIS_PASSWORD on the head from these, the storage
    namespace to the RayCluster's UID (each cluster a NewCluster upgrade builds starts empty), and
    the workers' GCS reconnect timeout to 600 s. The password is read by the kubelet from the env
    file the head's init container wrote (Kubernetes 1.35 EnvFiles, on by default)."""
    return {
        "redisAddress": spec.redis_address,
        "redisPassword": {
            "valueFrom": {"fileKeyRef": {"volumeName": auth.volume, "path": auth.env_file, "key": auth.key}}
        },
    }


def _with_gcs_auth(props: RayServiceProps, pod: dict[str, Any]) -> dict[str, Any]:
    """The head's template with the init container that writes the store's token to a
    memory-backed emptyDir (the Ray container does not mount it). KubeRay's Redis cleanup Job
    copies the head's template, init container included, so it can authenticate too."""
    ft, auth = props.gcs_fault_tolerance, props.gcs_auth
    if ft is None:
        return pod
    if auth is None:
        raise ValueError("RayServiceProps.gcs_fault_tolerance needs gcs_auth (the token reader)")
    spec = pod["spec"]
    (ray,) = spec["containers"]
    amounts = {"cpu": "100m", "memory": "256Mi"}
    spec["initContainers"] = [
        {
            "name": auth.container,
            "image": ray["image"],
            "command": ["python", "-c", auth.source],
            "env": [
                {"name": auth.secret_env, "value": ft.auth_secret_arn},
                {"name": auth.file_env, "value": f"{auth.mount_path}/{auth.env_file}"},
            ],
            "resources": {"requests": amounts, "limits": dict(amounts)},
            "volumeMounts": [{"name": auth.volume, "mountPath": auth.mount_path}],
        }
    ]
    spec["volumes"] = [*spec["volumes"], {"name": auth.volume, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}]
    return _annotated(pod, auth.annotation, auth.digest)


def _autoscaler(spec: RayAutoscalerSpec) -> dict[str, Any]:
    amounts = {"cpu": spec.cpu, "memory": spec.memory}
    return {
        # Default: add the pods pending replicas ask for at once (Conservative would ramp).
        "upscalingMode": "Default",
        "idleTimeoutSeconds": spec.idle_timeout_s,
        "resources": {"requests": amounts, "limits": dict(amounts)},
    }


def _head_group(props: RayServiceProps) -> dict[str, Any]:
    return {
        # CPU-only head: it must never be picked for an engine replica.
        "rayStartParams": {
            "num-gpus": "0",
            "dashboard-host": "0.0.0.0",
            "object-store-memory": str(props.head.object_store_bytes),
        },
        "serviceType": "ClusterIP",
        "template": _with_gcs_auth(
            props, _with_program(props.failover_program, _FAILOVER_VOLUME, _with_api_keys(props, _head_pod(props)))
        ),
    }


def _region_env(region: str) -> list[dict[str, str]]:
    """Both names: botocore 1.44 reads only ``AWS_DEFAULT_REGION`` (configprovider.py); the AWS
    SDKs of other languages and the CLI v2 read ``AWS_REGION``. Ray 2.58's S3 mirror builds its
    client without a region, so without the first it signs for us-east-1 on the global endpoint."""
    return [{"name": "AWS_REGION", "value": region}, {"name": "AWS_DEFAULT_REGION", "value": region}]


def _head_pod(props: RayServiceProps) -> dict[str, Any]:
    failover = props.failover_program
    env = _api_keys_env(props, (failover.mount_path,) if failover else ())
    if props.api_keys and props.aws_region:
        env.extend(_region_env(props.aws_region))
    return {
        "spec": {
            **({"serviceAccountName": props.head_service_account} if props.head_service_account else {}),
            "nodeSelector": props.system_node_selector,
            "containers": [
                {
                    "name": "ray-head",
                    "image": props.image,
                    **({"env": env} if env else {}),
                    "resources": props.head.as_k8s(),
                    "ports": [
                        {"name": "gcs-server", "containerPort": 6379},
                        {"name": "dashboard", "containerPort": DASHBOARD_PORT},
                        {"name": "client", "containerPort": 10001},
                        {"name": "serve", "containerPort": SERVE_PORT},
                    ],
                    "volumeMounts": [_SHM_MOUNT],
                }
            ],
            "volumes": [_shm_volume(props.head)],
        }
    }


_SHM_MOUNT = {"name": "dshm", "mountPath": "/dev/shm"}


def _shm_volume(resources: PodResources) -> dict[str, Any]:
    # A container's own /dev/shm is 64 MiB; Ray's object store and NCCL need more.
    return {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{resources.shm_gib}Gi"}}


def _worker_group(props: RayServiceProps, group: WorkerGroupSpec) -> dict[str, Any]:
    env: list[dict[str, Any]] = [
        {"name": "FI_PROVIDER", "value": "efa"},
        # NIXL advertises this address to its peer; the pod IP is the one EFA reaches.
        {"name": "VLLM_HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        # Ray writes its processes' output to files under /tmp/ray unless told otherwise; this puts
        # the engines' lines (NIXL's "Backend ... was instantiated" among them) in the pod's log,
        # where `kubectl logs`, `verify` and log collectors read them.
        {"name": LOG_TO_STDERR, "value": "1"},
    ]
    if props.hybrid_model:
        env.append({"name": "VLLM_SSM_CONV_STATE_LAYOUT", "value": "DS"})
    if props.aws_region:
        # Ray's S3 mirror (boto3) signs for the regional endpoint, which the VPC's gateway endpoint serves.
        env.extend(_region_env(props.aws_region))
    guard, failover = props.kv_guard_program, props.failover_program
    cache = props.node_cache
    env.extend(_node_cache_env(cache, any(not served.model.weights.staged_uri for served in props.models)))
    cache_program = props.node_cache_program if cache else None
    if cache is not None and cache_program is None:
        raise ValueError("RayServiceProps.node_cache needs node_cache_program (the fill's code)")
    programs = (guard, failover, cache_program)
    env.extend(_api_keys_env(props, tuple(p.mount_path for p in programs if p)))
    if props.kv_guard:
        env.extend(
            [
                {"name": props.kv_guard.engine_cls_env, "value": props.kv_guard.engine_cls},
                {"name": props.kv_guard.mode_env, "value": props.kv_guard.mode},
            ]
        )
    low, high = group.replica_bounds or (group.replicas, group.replicas)
    spec: dict[str, Any] = {
        "groupName": group.name,
        "replicas": group.replicas,
        "minReplicas": low,
        "maxReplicas": high,
        "rayStartParams": {"object-store-memory": str(group.resources.object_store_bytes)},
    }
    if group.ray_resources:
        spec["resources"] = group.ray_resources
    template: dict[str, Any] = {}
    if group.replica_bounds:
        # Only the Ray autoscaler removes a worker (once no replica runs on it); the Cluster
        # Autoscaler must not evict one to consolidate nodes.
        template["metadata"] = {"annotations": {SAFE_TO_EVICT: "false"}}
    pod = _with_api_keys(
        props,
        {
            **template,
            "spec": {
                **({"serviceAccountName": props.worker_service_account} if props.worker_service_account else {}),
                "nodeSelector": group.node_selector,
                "containers": [
                    {
                        "name": "ray-worker",
                        "image": props.image,
                        "env": env,
                        "resources": group.resources.as_k8s(),
                        "securityContext": worker_security(props.worker_privileged),
                        "volumeMounts": [_SHM_MOUNT],
                    }
                ],
                "volumes": [_shm_volume(group.resources)],
            },
        },
    )
    pod = _with_program(failover, _FAILOVER_VOLUME, _with_program(guard, _KV_GUARD_VOLUME, pod))
    if cache is not None:
        pod = _with_node_cache(cache, _with_program(cache_program, _NODE_CACHE_CODE_VOLUME, pod))
    return {**spec, "template": pod}


# An unprivileged GPU worker: the EFA device comes from the device plugin (its device cgroup rule
# included), and IPC_LOCK lets NIXL register memory with it past the container's memlock limit (the
# kernel's ib_umem_get checks CAP_IPC_LOCK), as AWS's EKS guide and its NIXL-over-EFA samples run.
WORKER_SECURITY: dict[str, Any] = {
    "privileged": False,
    "allowPrivilegeEscalation": False,
    "capabilities": {"add": ["IPC_LOCK"]},
}


def worker_security(privileged: bool) -> dict[str, Any]:
    """The GPU worker container's securityContext (``RayServiceProps.worker_privileged``)."""
    return {"privileged": True} if privileged else dict(WORKER_SECURITY)


def _node_cache_env(cache: NodeCacheSpec | None, from_hub: bool) -> list[dict[str, Any]]:
    """The compile caches on the node's disk, in a folder of the image's key: vLLM's torch.compile
    artifacts, TorchInductor's kernels, Triton's (each keyed inside by the engine's settings and the
    kernels' source, so a settings change never reads a stale entry)."""
    if cache is None:
        return []
    compiled = f"{cache.mount_path}/compile/{cache.compile_key}"
    env = [
        {"name": "VLLM_CACHE_ROOT", "value": f"{compiled}/vllm"},
        {"name": "TORCHINDUCTOR_CACHE_DIR", "value": f"{compiled}/inductor"},
        {"name": "TRITON_CACHE_DIR", "value": f"{compiled}/triton"},
    ]
    if from_hub:  # a model downloads from the Hub: Hugging Face's cache on the node's disk too
        env.append({"name": "HF_HUB_CACHE", "value": f"{cache.mount_path}/huggingface"})
    return env


def _with_node_cache(cache: NodeCacheSpec, pod: dict[str, Any]) -> dict[str, Any]:
    """``pod`` with the node's disk mounted read-write (the kubelet creates the folder if missing)."""
    spec = pod["spec"]
    (container,) = spec["containers"]
    container["volumeMounts"] = [
        *container["volumeMounts"],
        {"name": _NODE_CACHE_VOLUME, "mountPath": cache.mount_path},
    ]
    volume = {"name": _NODE_CACHE_VOLUME, "hostPath": {"path": cache.host_path, "type": "DirectoryOrCreate"}}
    spec["volumes"] = [*spec["volumes"], volume]
    return pod
