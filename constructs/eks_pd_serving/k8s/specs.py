"""The RayService chart's typed props: plain frozen dataclasses, no cdk8s, no CloudFormation.
Both the chart (ray_service.py) and the serve config (serve_config.py) read them."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..phase import Phase

SERVE_PORT = 8000
DASHBOARD_PORT = 8265


@dataclass(frozen=True)
class Weights:
    """Where a model's weights come from. Every path an engine reads is derived from this when the
    serve config is rendered (``serve_config.engine_source``), never stored beside it: with a staged
    copy and the node cache, the node's folder for this repository and revision, filled from
    ``staged_uri``; a staged copy alone, ``staged_uri``; else the Hub's ``repository`` at
    ``revision``."""

    #: The Hugging Face repository (``Qwen/Qwen3.5-9B``).
    repository: str
    #: The revision served: a commit hash pins it (a branch moves).
    revision: str
    #: ``s3://bucket/prefix`` of this revision's staged snapshot (``ModelWeights.uri``; may be a
    #: deploy-time token). Default: "" (the engines download from the Hub at their start).
    staged_uri: str = ""

    @property
    def words(self) -> str:
        """What the weights are, with no deploy-time token in it: the phases' pair key digests this."""
        return f"{self.repository}@{self.revision}"


@dataclass(frozen=True)
class ModelSpec:
    """What both engines serve."""

    model_id: str
    weights: Weights
    max_model_len: int
    dtype: str
    gpu_memory_utilization: float
    # Text only: vLLM skips the vision tower (and its memory profiling) of a multimodal model.
    language_model_only: bool = False
    #: Both engines run a request's own chat template (vLLM's ``trust_request_chat_template``) and
    #: the ingress lets it through. Default: False (refused with HTTP 400 at the ingress).
    trust_request_chat_template: bool = False


@dataclass(frozen=True)
class ReplicaAutoscaling:
    """Serve's ``autoscaling_config`` for one phase."""

    min_replicas: int
    max_replicas: int
    target_ongoing_requests: float
    #: Load above target this long adds replicas. Default: 30 s (Serve's): an engine takes
    #: minutes to start, so waiting longer only adds to that.
    upscale_delay_s: float = 30.0
    #: Load below target this long removes replicas. Default: 900 s: a removed replica costs
    #: minutes (node, image, weights) to bring back; keep it through a quarter-hour lull.
    downscale_delay_s: float = 900.0


@dataclass(frozen=True)
class EngineSpec:
    """One phase (prefill or decode)."""

    replicas: int
    tensor_parallel_size: int
    enforce_eager: bool
    # A Ray resource only this phase's worker group offers; pins its replicas there.
    placement_resource: str | None = None
    # None: ``replicas`` replicas, fixed.
    autoscaling: ReplicaAutoscaling | None = None
    # Batch limits and weight format written into the engine config, so vLLM never picks them by
    # the GPU it finds. None: left out (vLLM's own).
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    quantization: str | None = None
    #: A replica being removed (scale-down, redeploy) stops taking requests and gets this long to
    #: finish its streams before it is killed. Default: 300 s, a 4,096-token answer at ~15 tokens/s.
    graceful_shutdown_timeout_s: float = 300.0
    #: Serve asks each replica's engine whether it is alive this often, and waits this long; three
    #: failures in a row restart the replica. Default: 10 s and 10 s (Ray Serve LLM 2.58's own),
    #: written out so a Ray upgrade cannot change them unseen. vLLM's check raises only once the
    #: engine is dead; a request failed by a KV load does not make the replica unhealthy.
    health_check_period_s: float = 10.0
    health_check_timeout_s: float = 10.0

    @property
    def most_replicas(self) -> int:
        """The most replicas the phase runs: its autoscaling bound, or its fixed count."""
        return self.autoscaling.max_replicas if self.autoscaling else self.replicas


@dataclass(frozen=True)
class PodProgram:
    """Python a Ray pod imports, as data: a ConfigMap holding ``file_name`` mounted read-only at
    ``mount_path`` (on the pod's PYTHONPATH), and the source's digest as the pod annotation
    ``annotation``, so new code changes the pod template on purpose."""

    config_map: str
    file_name: str
    source: str
    digest: str
    mount_path: str
    annotation: str


@dataclass(frozen=True)
class NodeCacheSpec:
    """The GPU node's disk for what an engine start would otherwise fetch or build again, mounted on
    every GPU worker: each staged model's copy (``weights_folder``, filled before each engine start
    by ``fill_callback``, Ray's ``LLMConfig.callback_config``, from the staged snapshot) and vLLM's,
    TorchInductor's and Triton's compile caches under ``compile_key`` (the image's repository and
    tag). Hugging Face's cache is there too whenever a model downloads from the Hub."""

    host_path: str
    mount_path: str
    compile_key: str
    #: The fill's import path (``module:Class``), shipped as ``RayServiceProps.node_cache_program``.
    fill_callback: str
    #: Where a staged model's engines share their compile caches in its weights' bucket: one archive
    #: per engine settings under this prefix (``compiled_key``), filled before an engine starts and
    #: uploaded once after its first healthy start; the workers need read and write there. Default:
    #: None (each node compiles its own).
    compile_prefix: str | None = None

    def compiled_key(self, llm_config: dict[str, Any]) -> str | None:
        """The compile archive's key of one engine's ``LLMConfig`` (its model and engine settings:
        vLLM's and Triton's own keys inside the archive are of the same), or None when not shared."""
        if self.compile_prefix is None:
            return None
        what = {k: llm_config[k] for k in ("model_loading_config", "engine_kwargs")}
        digest = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]
        return f"{self.compile_prefix}/{digest}.tar.gz"

    def weights_folder(self, weights: Weights) -> str:
        """Where a node keeps one revision of a model (no deploy-time token in it)."""
        return f"{self.mount_path}/weights/{weights.repository.replace('/', '--')}/{weights.revision}"


@dataclass(frozen=True)
class ProxyHook:
    """The Serve proxies' checks (the body's bound, the API keys) as the pods load them: their code
    (``program``, on every Ray pod's PYTHONPATH), Ray's hook that imports it (``callback_env`` =
    ``callback``) and the env names it reads."""

    program: PodProgram
    callback_env: str
    callback: str
    secret_env: str
    refresh_env: str
    max_stale_env: str
    #: The env naming the largest body a proxy relays. Default: the hook's own name for it.
    max_body_env: str = "EKS_PD_MAX_BODY_BYTES"


@dataclass(frozen=True)
class InitProgram:
    """A program the head's init container runs (``python -c source``): it reads the secret named by
    ``secret_env`` and writes ``key=...`` to ``env_file`` (named by ``file_env``) on the
    memory-backed ``volume`` at ``mount_path``; ``annotation`` carries the source's digest."""

    container: str
    source: str
    digest: str
    annotation: str
    volume: str
    mount_path: str
    env_file: str
    key: str
    secret_env: str
    file_env: str


@dataclass(frozen=True)
class KvGuardSpec:
    """Decode's KV guard: the engine class the GPU workers' replicas build (``engine_cls_env`` names
    it in the workers' env, beside the code it names: both change with the RayCluster, never the
    serve config alone) and the guard's mode (``mode_env``: auto or on). Prefill's engines stand
    aside (they pull nothing)."""

    mode: str
    engine_cls: str
    engine_cls_env: str
    mode_env: str


@dataclass(frozen=True)
class FailoverSpec:
    """The PD pair's failover (``eks_pd_failover``), which also splits the pair into one Serve
    application per phase: ``import_paths`` names each application's builder by role (prefill,
    decode, ingress). ``wait_s``: the longest a request waits for a replica of one engine;
    ``prefill_timeout_s``: for prefill's answer; ``short_prompt_tokens``: prompts of at most this
    many tokens are served on decode alone (0: none)."""

    import_paths: Mapping[str, str]
    wait_s: float
    prefill_timeout_s: float
    short_prompt_tokens: int
    #: The Ray and vLLM version pairs the failover's upstream record covers: an engine replica on any
    #: other refuses to start. Default: () (not checked).
    covered: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class KvTransferSpec:
    """How NIXL moves KV blocks from prefill to decode."""

    backend: str
    buffer_device: str
    # vLLM's kv_load_failure_policy on the decode side, always written: "recompute" makes decode
    # recompute the blocks it could not pull (a prefill replica gone); "fail" ends the request with
    # an error (vLLM 0.26.0's default). mapping.kv_load_failure_policy decides which.
    load_failure_policy: str = "fail"


@dataclass(frozen=True)
class ServedModel:
    """One served model, the unit the serve config is built from: what both engines load, each
    phase's engine and replicas, how KV moves between them, and the failover. With ``failover``,
    each phase is a Serve application of its own (``<name>-prefill``, ``<name>-decode``) and one
    ingress application serves every model; without, Ray's ``build_pd_openai_app`` (one model)."""

    model: ModelSpec
    prefill: EngineSpec
    decode: EngineSpec
    kv: KvTransferSpec
    failover: FailoverSpec | None = None
    #: Its Serve applications' prefix (unique per RayService). Default: "pd".
    name: str = "pd"

    def engine(self, phase: Phase) -> EngineSpec:
        return self.prefill if phase is Phase.PREFILL else self.decode


@dataclass(frozen=True)
class PodResources:
    """Requests equal limits, so pods are Guaranteed and never evicted for memory first."""

    cpu: int
    memory_gib: int
    gpus: int = 0
    efa_interfaces: int = 0
    # Memory-backed /dev/shm; Ray's object store is set to fit inside it (object_store_bytes).
    shm_gib: int = 0

    @property
    def object_store_bytes(self) -> int:
        """Ray's object store, set inside /dev/shm. Left to itself Ray 2.58 takes 30% of the pod's
        memory, capped by what /dev/shm holds at start but never below 10 GB, so a head with a
        container's 64 MiB /dev/shm puts its store in /tmp and warns. A tenth of /dev/shm stays
        free for NCCL and vLLM's shared-memory queues."""
        return self.shm_gib * 2**30 * 9 // 10

    def as_k8s(self) -> dict[str, dict[str, Any]]:
        amounts: dict[str, Any] = {"cpu": str(self.cpu), "memory": f"{self.memory_gib}Gi"}
        limits = dict(amounts)
        if self.gpus:
            limits["nvidia.com/gpu"] = self.gpus
        if self.efa_interfaces:
            limits["vpc.amazonaws.com/efa"] = self.efa_interfaces
        return {"requests": amounts, "limits": limits}


@dataclass(frozen=True)
class WorkerGroupSpec:
    """One Ray worker group: a pod per GPU node, pinned to its node group by labels."""

    name: str
    replicas: int
    resources: PodResources
    node_selector: dict[str, str]
    # Ray logical resources the group's pods advertise (KubeRay `resources`).
    ray_resources: dict[str, str] = field(default_factory=dict)
    # With the Ray autoscaler: the pods it may run (``replicas`` is then the start). None: fixed.
    replica_bounds: tuple[int, int] | None = None


@dataclass(frozen=True)
class RayAutoscalerSpec:
    """KubeRay's in-tree Ray autoscaler (a sidecar of the head pod)."""

    #: An idle worker pod (no replica on it) is removed after this long; the Cluster Autoscaler
    #: then removes its empty node. Default: 300 s.
    idle_timeout_s: int = 300
    #: The sidecar's requests and limits. Default: 500m CPU, 512Mi (KubeRay's own default).
    cpu: str = "500m"
    memory: str = "512Mi"


@dataclass(frozen=True)
class ApiKeysSpec:
    """The Serve proxies' API key check (endpoint/proxy): which secret, read how often. EKS Pod
    Identity lets the head's and the workers' service accounts read it."""

    #: The Secrets Manager secret's ARN (a CloudFormation token until the manifest is applied).
    secret_arn: str
    #: Seconds between reads of the secret: a key added or removed takes effect within this.
    refresh_s: int
    #: Keys last read longer ago than this are not served (503 until a read succeeds).
    max_stale_s: int = 300


@dataclass(frozen=True)
class GcsFaultToleranceSpec:
    """KubeRay's ``gcsFaultToleranceOptions`` with an external Redis-protocol store: the head's GCS
    keeps its state there, so a restarted head resumes the cluster and the workers wait for it
    (KubeRay gives them 600 s). The token reaches the Ray container through the head's init
    container (fault_tolerance/auth), never through the manifest."""

    #: ``rediss://host:port`` (a CloudFormation token until the manifest is applied).
    redis_address: str
    #: The Secrets Manager secret holding the store's auth token (``{"token": ...}``).
    auth_secret_arn: str


@dataclass(frozen=True)
class RayServiceProps:
    name: str
    namespace: str
    image: str
    ray_version: str
    #: The served models (one from the settings; typed props may add more, each with failover).
    models: tuple[ServedModel, ...]
    head: PodResources
    workers: tuple[WorkerGroupSpec, ...]
    hybrid_model: bool
    # Labels of the nodes the Ray head runs on (CPU only, beside the operator).
    system_node_selector: dict[str, str]
    # KubeRay upgradeStrategy.type: None (serve config in place) or NewCluster (blue/green).
    upgrade_strategy: str = "None"
    # None: worker pods fixed at each group's replicas.
    autoscaler: RayAutoscalerSpec | None = None
    # The head's and the workers' Kubernetes service accounts (created with the RayService; EKS
    # Pod Identity gives them what they read: the staged weights, the API key secret) and the
    # region their AWS calls go to. None: the namespace's default account.
    head_service_account: str | None = None
    worker_service_account: str | None = None
    aws_region: str | None = None
    # None: no API key check; anyone who reaches the serve port may call it.
    api_keys: ApiKeysSpec | None = None
    # The GPU workers privileged; False: unprivileged with IPC_LOCK added (WORKER_SECURITY).
    worker_privileged: bool = False
    # The largest request body every Serve proxy relays (413 beyond it, before any byte is
    # relayed); needs ``api_keys_hook``. None: no bound at the proxy.
    max_body_bytes: int | None = None
    # None: no GCS fault tolerance; a head that restarts rebuilds the whole Ray cluster.
    gcs_fault_tolerance: GcsFaultToleranceSpec | None = None
    # The KV guard's code, mounted on every GPU worker whether the guard is on or off: turning it
    # off or on is then a serve-config change alone, and no running pod loses what it mounts.
    kv_guard_program: PodProgram | None = None
    # The key check's code and names, shipped in every configuration like the guard's; required
    # with ``api_keys``.
    api_keys_hook: ProxyHook | None = None
    # The GCS store's token reader; required with ``gcs_fault_tolerance``.
    gcs_auth: InitProgram | None = None
    # None: the engines are Ray's own (kv_pull_guard off).
    kv_guard: KvGuardSpec | None = None
    # The failover's code, mounted on the head and every GPU worker whether failover is on or off
    # (as the guard's); None: not shipped.
    failover_program: PodProgram | None = None
    # The node cache on every GPU worker; None: none (each start fetches and compiles anew).
    node_cache: NodeCacheSpec | None = None
    # The node cache's code, applied whether the cache is on or off (as the failover's): pods of a
    # RayCluster built with it mount it until that cluster is rebuilt. Required with ``node_cache``.
    node_cache_program: PodProgram | None = None
    # The rollout Jobs' program (the cluster's and the serve config's share it), shipped once with
    # the namespace chart; None: each rollout chart ships its own (``RolloutSpec.ships_program``).
    rollout_program: PodProgram | None = None

    @property
    def serve_service_name(self) -> str:
        """The ClusterIP Service KubeRay creates in front of the serve app."""
        return f"{self.name}-serve-svc"
