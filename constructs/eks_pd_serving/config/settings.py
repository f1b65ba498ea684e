"""Every setting of the deployment, with its type, default and documentation. The rules that
judge one value live in fields.py, those across settings in rules.py."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .. import versions
from ..catalog import LOG_RETENTION_DAYS
from ..layout import DEFAULT_PHASE_NODE_COUNT
from ..phase import Phase
from .fields import NIXL_NETWORK_BACKENDS

# Autoscaling defaults: one replica of each phase always warm, a second when load asks for it.
DEFAULT_MIN_REPLICAS = 1
DEFAULT_MAX_REPLICAS = 2
# Prefill requests last one forward pass of the prompt; decode streams last the whole answer and
# a replica holds many (the default L4 engine fits the concurrency `sizing` prints, about 15).
DEFAULT_TARGET_ONGOING_REQUESTS = {Phase.PREFILL: 4, Phase.DECODE: 8}


def _hint(text: str, *, means: str | None = None) -> dict[str, Any]:
    """``hint``: what a valid value looks like (the 'Fix: set <key> to ...' of a one-line error).
    ``means``: what an unset (None) default does; a literal default is its own documentation.
    The settings reference (docs/reference/settings.md) is generated from both."""
    return {"hint": text} if means is None else {"hint": text, "default_means": means}


class Settings(BaseModel):
    """The fields. Defaults reproduce the AWS reference walkthrough."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cluster_name: str = Field(
        "ray-llm-multinode",
        description="EKS cluster name.",
        json_schema_extra=_hint("1-100 letters, digits, '-' or '_', starting with a letter or digit"),
    )
    kubernetes_version: str = Field(
        versions.DEFAULT_KUBERNETES_VERSION,
        description="EKS Kubernetes version; the matching kubectl layer is chosen with it.",
        json_schema_extra=_hint(f"one of {', '.join(versions.KUBERNETES_RELEASES)}"),
    )
    region: str | None = Field(
        None,
        description="AWS region, when known at synth.",
        json_schema_extra=_hint("a region name such as us-east-1", means="none (environment-agnostic stack)"),
    )
    availability_zones: tuple[str, ...] | None = Field(
        None,
        description="AZs of the VPC (two or more).",
        json_schema_extra=_hint(
            "two or more AZ names of one region, comma-separated", means="the region's first two AZs"
        ),
    )
    gpu_availability_zone: str | None = Field(
        None,
        description="AZ of the GPU node group (EFA does not cross AZs); must be one of availability_zones.",
        json_schema_extra=_hint(
            "an AZ name listed in availability_zones, such as us-east-1a", means="the VPC's first AZ"
        ),
    )
    nat_gateways: int = Field(
        1,
        ge=1,
        description="NAT gateways; one per AZ removes the single point of failure.",
        json_schema_extra=_hint("a whole number from 1 to the number of AZs"),
    )
    endpoint_allowed_cidrs: tuple[str, ...] = Field(
        ("0.0.0.0/0",),
        min_length=1,
        description="IPv4 CIDRs allowed to reach the public API endpoint. Synth warns while it includes 0.0.0.0/0.",
        json_schema_extra=_hint("IPv4 CIDRs such as 203.0.113.0/24, comma-separated"),
    )
    admin_role_arn: str | None = Field(
        None,
        description="IAM role granted cluster admin through an access entry.",
        json_schema_extra=_hint(
            "an IAM role ARN such as arn:aws:iam::123456789012:role/Admin",
            means="the stack creates a cluster-admin role that principals of this account may assume (IAM decides who)",
        ),
    )
    system_instance_type: str = Field(
        "m7i.xlarge",
        description="Instance type of the system node group (operator, Ray head).",
        json_schema_extra=_hint("a type with at least 4 vCPUs and 16 GiB, such as m7i.xlarge"),
    )
    system_node_count: int = Field(
        1,
        ge=1,
        le=10,
        description="Nodes in the system node group.",
        json_schema_extra=_hint("a whole number from 1 to 10"),
    )
    system_root_volume_gib: int = Field(
        100,
        ge=80,
        le=16384,
        description=(
            "gp3 root volume of each system node, GiB: the Ray head pulls the Ray LLM CUDA image (tens of GB,"
            " held packed and unpacked during the pull)."
        ),
        json_schema_extra=_hint("a whole number of GiB from 80 to 16384"),
    )
    log_retention_days: int = Field(
        30,
        description=(
            "Retention of the log groups the stack owns (EKS control plane, Lambdas, and with observability "
            "the add-on's /aws/containerinsights/<cluster>/* groups), days; they are deleted with the stack."
        ),
        json_schema_extra=_hint(f"one of CloudWatch's retention periods: {', '.join(map(str, LOG_RETENTION_DAYS))}"),
    )
    gpu_instance_type: str = Field(
        "g6.8xlarge",
        description="Instance type of the GPU node group; needs a GPU and EFA.",
        json_schema_extra=_hint("a GPU type with EFA, such as g6.8xlarge"),
    )
    fast_image_pull: bool = Field(
        True,
        description=(
            "Pull and unpack the serving image on the GPU nodes in parallel: nodeadm's FastImagePull feature gate "
            "(SOCI's parallel pull mode, on the EKS AL2023 AMIs since v20250821; nodeadm ignores it below 4 vCPUs "
            "and 7 GiB). Where the pull writes to the root volume (node_cache off, or a type without instance "
            "storage) its gp3 throughput is raised to 600 MiB/s as the AMI's docs recommend (about $19 a node-month "
            "above gp3's included 125 MiB/s, us-east-1); with node_cache on an instance store it stays at 125."
        ),
        json_schema_extra=_hint("true or false"),
    )
    gpu_worker_privileged: bool = Field(
        False,
        description=(
            "Run the GPU workers privileged. Off, they run unprivileged with IPC_LOCK added (to register memory "
            "with the EFA device beyond the memlock limit), the EFA device from the device plugin, as AWS's EKS "
            "guide runs EFA pods. Turn on only if NIXL logs a memory registration failure (fi_mr_reg) on EFA."
        ),
        json_schema_extra=_hint("true or false"),
    )
    node_cache: bool = Field(
        True,
        description=(
            "Keep on each GPU node what an engine start would otherwise fetch or build again: the instance store's "
            "NVMe disks as one RAID0 array (nodeadm's localStorage; containerd's images land there too), the "
            "checkpoint copied there once per node and revision (weights_source=s3: a pod or replica restart reads "
            "no weights from S3; the newest two revisions are kept) and vLLM's and Triton's compile caches keyed by "
            "the image. A type without instance storage keeps them on its root volume."
        ),
        json_schema_extra=_hint("true or false"),
    )
    shared_compile_cache: bool = Field(
        True,
        description=(
            "Share the engines' compile caches (vLLM's, TorchInductor's, Triton's) between GPU nodes through the "
            "weights bucket (with node_cache on and weights_source=s3; otherwise each node compiles its own). After an "
            "engine's first healthy start on a node it uploads them once as compile/<image key>/<engine settings "
            "digest>.tar.gz (a conditional write: the first node wins, nothing is overwritten), and a node that has "
            "none extracts them before its engine starts, so no node compiles kernels another node of the same image "
            "and settings compiled (about 80 s of a first start, measured on an H100). The GPU workers then may write "
            "under compile/ (never under models/): a compromised worker could leave kernels that other nodes run. "
            "Turn off to keep the workers read-only on the bucket. Archives expire 30 days after their upload."
        ),
        json_schema_extra=_hint("true or false"),
    )
    gpu_node_count: int = Field(
        2,
        ge=1,
        le=16,
        description="Nodes in the GPU node group (one Ray worker pod each).",
        json_schema_extra=_hint("a whole number from 1 to 16"),
    )
    gpu_root_volume_gib: int = Field(
        200,
        ge=100,
        le=16384,
        description="gp3 root volume of each GPU node, GiB (images and model cache).",
        json_schema_extra=_hint("a whole number of GiB from 100 to 16384"),
    )

    gpu_layout: Literal["shared", "per_phase"] = Field(
        "shared",
        description=(
            "shared: one GPU node group runs both phases (the walkthrough). per_phase: prefill and decode "
            "each get their own GPU node group and Ray worker group."
        ),
        json_schema_extra=_hint("shared or per_phase"),
    )
    prefill_gpu_instance_type: str | None = Field(
        None,
        description="per_phase only: instance type of the prefill node group.",
        json_schema_extra=_hint("a GPU type with EFA, such as g6e.8xlarge", means="gpu_instance_type"),
    )
    prefill_gpu_node_count: int | None = Field(
        None,
        ge=1,
        le=16,
        description="per_phase only: nodes in the prefill node group.",
        json_schema_extra=_hint("a whole number from 1 to 16", means=str(DEFAULT_PHASE_NODE_COUNT)),
    )
    decode_gpu_instance_type: str | None = Field(
        None,
        description="per_phase only: instance type of the decode node group.",
        json_schema_extra=_hint("a GPU type with EFA, such as g6.8xlarge", means="gpu_instance_type"),
    )
    decode_gpu_node_count: int | None = Field(
        None,
        ge=1,
        le=16,
        description="per_phase only: nodes in the decode node group.",
        json_schema_extra=_hint("a whole number from 1 to 16", means=str(DEFAULT_PHASE_NODE_COUNT)),
    )
    gpu_capacity: str = Field(
        "on-demand",
        description=(
            "How the GPU nodes are bought (docs/features/capacity.md): on-demand; odcr:<cr-id> or odcr-group:<ARN>, "
            "an On-Demand Capacity Reservation; capacity-block:<cr-id>, an EC2 Capacity Block for ML. A reservation "
            "brings its own placement (no stack placement group); preflight and the deploy check its type, AZ, count "
            "and window. A Capacity Block's group is scaled to zero an hour before the block ends, warned a day ahead."
        ),
        json_schema_extra=_hint(
            "on-demand, odcr:cr-<17 hex>, odcr-group:<resource group ARN> or capacity-block:cr-<17 hex>"
        ),
    )
    prefill_capacity: str | None = Field(
        None,
        description="per_phase only: the prefill group's capacity, as gpu_capacity, or spot (prefill only).",
        json_schema_extra=_hint("as gpu_capacity, or spot", means="gpu_capacity"),
    )
    decode_capacity: str | None = Field(
        None,
        description="per_phase only: the decode group's capacity, as gpu_capacity (not spot: it holds the streams).",
        json_schema_extra=_hint("as gpu_capacity", means="gpu_capacity"),
    )

    observability: bool = Field(
        True,
        description=(
            "The CloudWatch Observability add-on (Container Insights with GPU and EFA metrics, container "
            "logs, the Ray pods' Prometheus metrics), a dashboard and alarms; false: none of it."
        ),
        json_schema_extra=_hint("true or false"),
    )
    cloudwatch_addon_version: str = Field(
        versions.CLOUDWATCH_OBSERVABILITY_ADDON_VERSION,
        pattern=r"^v\d+\.\d+\.\d+-eksbuild\.\d+$",
        description=(
            "observability only: version of the amazon-cloudwatch-observability EKS add-on; `preflight` asks "
            "EKS whether it is offered for kubernetes_version."
        ),
        json_schema_extra=_hint("an add-on version such as v6.4.0-eksbuild.1"),
    )
    alarm_email: str | None = Field(
        None,
        pattern=r"^[^@\s,]+@[^@\s,]+\.[^@\s,]+$",
        description=(
            "observability only: an address the alarms notify through an SNS topic (AWS e-mails it a "
            "confirmation link first)."
        ),
        json_schema_extra=_hint(
            "one e-mail address such as ops@example.com", means="none (the alarms only change state)"
        ),
    )

    autoscaling: bool = Field(
        False,
        description=(
            "Scale each phase with load: Serve replicas between the min/max below, Ray worker pods with them "
            "(KubeRay autoscaler), GPU nodes with the pods (Cluster Autoscaler)."
        ),
        json_schema_extra=_hint("true or false"),
    )
    prefill_min_replicas: int | None = Field(
        None,
        ge=0,
        le=64,
        description="autoscaling only: fewest prefill replicas; 0 lets prefill scale to zero.",
        json_schema_extra=_hint("a whole number from 0 to 64", means=str(DEFAULT_MIN_REPLICAS)),
    )
    prefill_max_replicas: int | None = Field(
        None,
        ge=1,
        le=64,
        description="autoscaling only: most prefill replicas.",
        json_schema_extra=_hint("a whole number from 1 to 64", means=str(DEFAULT_MAX_REPLICAS)),
    )
    decode_min_replicas: int | None = Field(
        None,
        ge=0,
        le=64,
        description="autoscaling only: fewest decode replicas; 0 lets decode scale to zero.",
        json_schema_extra=_hint("a whole number from 0 to 64", means=str(DEFAULT_MIN_REPLICAS)),
    )
    decode_max_replicas: int | None = Field(
        None,
        ge=1,
        le=64,
        description="autoscaling only: most decode replicas.",
        json_schema_extra=_hint("a whole number from 1 to 64", means=str(DEFAULT_MAX_REPLICAS)),
    )
    prefill_target_ongoing_requests: float | None = Field(
        None,
        gt=0,
        description=(
            "autoscaling only: requests in flight per prefill replica that Serve scales towards (a prefill "
            "request lasts one forward pass of the prompt)."
        ),
        json_schema_extra=_hint(
            "a number above 0, such as 4", means=str(DEFAULT_TARGET_ONGOING_REQUESTS[Phase.PREFILL])
        ),
    )
    decode_target_ongoing_requests: float | None = Field(
        None,
        gt=0,
        description=(
            "autoscaling only: streams in flight per decode replica that Serve scales towards; keep it below "
            "the sizing's concurrency (`python -m eks_pd_serving sizing` prints it)."
        ),
        json_schema_extra=_hint(
            "a number above 0, such as 8", means=str(DEFAULT_TARGET_ONGOING_REQUESTS[Phase.DECODE])
        ),
    )
    gpu_min_node_count: int | None = Field(
        None,
        ge=0,
        le=64,
        description="autoscaling, shared layout: fewest GPU nodes.",
        json_schema_extra=_hint("a whole number from 0 to 64", means="the nodes the phases' minimum replicas need"),
    )
    gpu_max_node_count: int | None = Field(
        None,
        ge=1,
        le=64,
        description="autoscaling, shared layout: most GPU nodes.",
        json_schema_extra=_hint("a whole number from 1 to 64", means="the nodes the phases' maximum replicas need"),
    )
    prefill_gpu_min_node_count: int | None = Field(
        None,
        ge=0,
        le=64,
        description="autoscaling, per_phase layout: fewest prefill nodes.",
        json_schema_extra=_hint("a whole number from 0 to 64", means="what prefill_min_replicas need"),
    )
    prefill_gpu_max_node_count: int | None = Field(
        None,
        ge=1,
        le=64,
        description="autoscaling, per_phase layout: most prefill nodes.",
        json_schema_extra=_hint("a whole number from 1 to 64", means="what prefill_max_replicas need"),
    )
    decode_gpu_min_node_count: int | None = Field(
        None,
        ge=0,
        le=64,
        description="autoscaling, per_phase layout: fewest decode nodes.",
        json_schema_extra=_hint("a whole number from 0 to 64", means="what decode_min_replicas need"),
    )
    decode_gpu_max_node_count: int | None = Field(
        None,
        ge=1,
        le=64,
        description="autoscaling, per_phase layout: most decode nodes.",
        json_schema_extra=_hint("a whole number from 1 to 64", means="what decode_max_replicas need"),
    )

    namespace: str = Field(
        "inference",
        description="Kubernetes namespace of the RayService.",
        json_schema_extra=_hint("a DNS-1123 label: lowercase letters, digits and '-', at most 63"),
    )
    ray_service_name: str = Field(
        "ray-llm",
        description="Name of the RayService; the serve service is <name>-serve-svc.",
        json_schema_extra=_hint("lowercase letters, digits and '-', starting with a letter, at most 40"),
    )
    image: str | None = Field(
        None,
        description="Ray image of head and workers.",
        json_schema_extra=_hint("an image reference without spaces", means="the Ray LLM DLC in the stack's region"),
    )
    model_id: str = Field(
        "qwen3.5-9b",
        description="Model name clients send in requests.",
        json_schema_extra=_hint("a name without spaces"),
    )
    model_source: str = Field(
        "Qwen/Qwen3.5-9B",
        description="Hugging Face repository (or path) of the weights.",
        json_schema_extra=_hint("a Hugging Face repository such as Qwen/Qwen3.5-9B"),
    )
    model_config_json: str | None = Field(
        None,
        description=(
            "Path (relative to where synth runs) of the model's own config.json, from its Hugging Face "
            "repository at the revision served: how synth sizes a model_source outside the catalogue."
        ),
        json_schema_extra=_hint(
            "a path to a config.json, such as models/my-model/config.json",
            means="the catalogue's entry for model_source; synth refuses a model outside it",
        ),
    )
    model_revision: str = Field(
        "main",
        description=(
            "Hugging Face revision of the weights: a commit hash pins what is served; a branch or tag is "
            "resolved when first staged and then kept (the bucket holds one copy per revision setting)."
        ),
        json_schema_extra=_hint("a commit hash, branch or tag such as main"),
    )
    weights_source: Literal["s3", "huggingface"] = Field(
        "s3",
        description=(
            "Where the engines load the weights from: s3 stages them once per revision into the stack's "
            "bucket (a CodeBuild job the deploy waits for) and the engines read them there through the S3 "
            "gateway endpoint; huggingface downloads them at every engine start, through the NAT."
        ),
        json_schema_extra=_hint("s3 or huggingface"),
    )
    hf_token_secret: str | None = Field(
        None,
        description=(
            "Name or ARN of a Secrets Manager secret whose value is a Hugging Face token, for gated models. "
            "Only the staging job reads it; it never appears in the template, the serve config or a pod."
        ),
        json_schema_extra=_hint("a secret name such as hf/token, or its ARN", means="no token: public models only"),
    )
    served_models: tuple[str, ...] = Field(
        (),
        description=(
            "More models served behind the same endpoint, each model_id=repository@revision (a catalogue model): "
            "each gets prefill and decode engines of its own with the Engines settings, sized for its own "
            "checkpoint, on the same GPU groups (they must hold every model's GPUs: raise gpu_node_count), its "
            "weights loaded as model_source's are (weights_source). Clients choose by the model field."
        ),
        json_schema_extra=_hint(
            "entries model_id=repository@revision such as qwen3-8b=Qwen/Qwen3-8B@main, comma-separated"
        ),
    )
    model_bucket_removal: Literal["destroy", "retain"] = Field(
        "destroy",
        description=(
            "What cdk destroy does to the model bucket and its key: destroy empties and deletes them (nothing "
            "left behind); retain keeps both, and their storage charges, for your own reuse."
        ),
        json_schema_extra=_hint("destroy or retain"),
    )
    max_model_len: int = Field(
        4096,
        ge=16,
        description="Longest prompt plus completion, tokens.",
        json_schema_extra=_hint("a whole number of tokens, at least 16"),
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "bfloat16",
        description="Weight and activation dtype.",
        json_schema_extra=_hint("one of auto, bfloat16, float16, float32"),
    )
    multimodal: bool = Field(
        False,
        description=(
            "Load the model's vision tower and accept image/video input. Off, vLLM runs the text model only "
            "(language_model_only), which for Qwen3.5-9B on an L4 leaves 9x the KV cache."
        ),
        json_schema_extra=_hint("true or false"),
    )
    max_request_body_mib: int | None = Field(
        None,
        ge=1,
        le=1024,
        description=(
            "The largest request body every Serve proxy relays (HTTP 413 beyond it, before a byte reaches the "
            "ingress). It must hold max_model_len tokens as JSON: max_model_len x 256 characters x 6 bytes + 1 MiB "
            "(7 MiB at 4,096). A change of it rebuilds the Ray cluster (the proxies read it at start)."
        ),
        json_schema_extra=_hint(
            "a whole number of MiB, 1 to 1024",
            means=(
                "what max_model_len needs, rounded up to a power of two, at least 16 MiB (16 up to max_model_len "
                "10,240, 64 at 32,768), so most max_model_len changes leave it, and every pod, as they are"
            ),
        ),
    )
    trust_request_chat_template: bool = Field(
        False,
        description=(
            "Let a request carry its own chat template (chat_template, top level or in chat_template_kwargs): "
            "both engines then run it (vLLM's --trust-request-chat-template). Off, the ingress refuses it with "
            "HTTP 400: a template is code the tokenizer runs, and one can hold an engine's CPU for seconds."
        ),
        json_schema_extra=_hint("true or false"),
    )
    gpu_memory_utilization: float = Field(
        0.90,
        gt=0.0,
        le=0.98,
        description="Fraction of GPU memory vLLM may use.",
        json_schema_extra=_hint("a number above 0 and at most 0.98"),
    )
    quantization: Literal["none", "fp8"] = Field(
        "none",
        description=(
            "Weight format of both engines. none: the checkpoint's dtype. fp8: vLLM stores the Linear "
            "layers' weights in FP8 at load (online, from the checkpoint): about 6.4 GiB less for "
            "Qwen3.5-9B, about 3.4x the KV cache at an L4 budget (measured); accuracy not measured here."
        ),
        json_schema_extra=_hint("none or fp8"),
    )
    prefill_enforce_eager: bool = Field(
        True,
        description="Disable CUDA graphs on prefill.",
        json_schema_extra=_hint("true or false"),
    )
    decode_enforce_eager: bool = Field(
        True,
        description="Disable CUDA graphs on decode.",
        json_schema_extra=_hint("true or false"),
    )
    prefill_max_num_seqs: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="Sequences one prefill engine schedules at once (vLLM's max_num_seqs), written into its config.",
        json_schema_extra=_hint(
            "a whole number from 1 to 1024",
            means="what the KV cache holds at max_model_len (the sizing), within vLLM's Mamba-block rule",
        ),
    )
    decode_max_num_seqs: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="Sequences one decode engine schedules at once (vLLM's max_num_seqs), written into its config.",
        json_schema_extra=_hint(
            "a whole number from 1 to 1024",
            means="what the KV cache holds at max_model_len (the sizing), within vLLM's Mamba-block rule",
        ),
    )
    prefill_replicas: int = Field(
        1,
        ge=1,
        description="Prefill engine replicas, fixed (refused with autoscaling: see prefill_min_replicas).",
        json_schema_extra=_hint("a whole number, at least 1"),
    )
    decode_replicas: int = Field(
        1,
        ge=1,
        description="Decode engine replicas, fixed (refused with autoscaling: see decode_min_replicas).",
        json_schema_extra=_hint("a whole number, at least 1"),
    )
    prefill_tensor_parallel_size: int = Field(
        1,
        description="GPUs per prefill replica.",
        json_schema_extra=_hint("1, 2, 4 or 8"),
    )
    decode_tensor_parallel_size: int = Field(
        1,
        description="GPUs per decode replica.",
        json_schema_extra=_hint("1, 2, 4 or 8"),
    )
    kv_backend: str = Field(
        "LIBFABRIC",
        description="NIXL backend that moves the KV cache; LIBFABRIC uses EFA.",
        json_schema_extra=_hint(f"one of {', '.join(NIXL_NETWORK_BACKENDS)}"),
    )
    endpoint_exposure: Literal["port-forward", "internal"] = Field(
        "port-forward",
        description=(
            "Who can call the OpenAI endpoint. port-forward: a ClusterIP Service only (kubectl port-forward)."
            " internal: also an internal Network Load Balancer in the private subnets (AWS Load Balancer "
            "Controller), reachable from endpoint_client_cidrs."
        ),
        json_schema_extra=_hint("port-forward or internal"),
    )
    endpoint_client_cidrs: tuple[str, ...] | None = Field(
        None,
        min_length=1,
        description=(
            "IPv4 CIDRs allowed to call the internal endpoint (the NLB's security group and the serve port's "
            "NetworkPolicy)."
        ),
        json_schema_extra=_hint("IPv4 CIDRs such as 10.0.0.0/16, comma-separated", means="the VPC's CIDR"),
    )
    api_keys: bool | None = Field(
        None,
        description=(
            "API keys on every route of the endpoint, checked by each Serve proxy before any engine work "
            "(docs/features/api-keys.md); a request without a known key gets 401. The keys live in Secrets "
            "Manager: api_keys_secret_arn, or a secret the stack creates with a generated first key."
        ),
        json_schema_extra=_hint("true or false", means="on with endpoint_exposure=internal, off with port-forward"),
    )
    api_keys_secret_arn: str | None = Field(
        None,
        description=(
            "Complete ARN of your own Secrets Manager secret holding the keys (a JSON object of key id to key, "
            "each key 32 or more characters). Only the Ray pods read it (EKS Pod Identity, this secret only)."
        ),
        json_schema_extra=_hint(
            "a secret's complete ARN, arn:aws:secretsmanager:<region>:<account>:secret:<name>-<6 characters>",
            means="a secret created by the stack, its first key generated (deleted on destroy)",
        ),
    )
    api_keys_refresh_s: int = Field(
        30,
        ge=5,
        le=3600,
        description=(
            "Seconds between each proxy's reads of the key secret: a key added or removed takes effect within "
            "this, without a restart."
        ),
        json_schema_extra=_hint("a whole number of seconds from 5 to 3600"),
    )
    api_keys_max_stale_s: int = Field(
        300,
        ge=10,
        le=86400,
        description=(
            "Longest a proxy serves the keys it last read while reads of the secret fail (Secrets Manager or "
            "its credentials unreachable); after it every request gets 503 until a read succeeds. The bound on "
            "how long a revoked key can outlive its removal. Default 300 s: ten reads at the default refresh, "
            "longer than a credential refresh or a brief regional blip, short enough for a revoked key. At "
            "least twice api_keys_refresh_s."
        ),
        json_schema_extra=_hint("a whole number of seconds, at least twice api_keys_refresh_s"),
    )
    tls_certificate_arn: str | None = Field(
        None,
        description=(
            "ACM certificate ARN: the internal NLB listens with TLS on 443 and plain HTTP is off "
            "(endpoint_exposure=internal only)."
        ),
        json_schema_extra=_hint(
            "an ACM certificate ARN, arn:aws:acm:<region>:<account>:certificate/<id>", means="plain HTTP on port 80"
        ),
    )
    access_logs_bucket: str | None = Field(
        None,
        description=(
            "Name of an S3 bucket of yours in this account and region for access logs: the weights bucket's "
            "server access logs (weights_source=s3), under <cluster_name>/s3/, and the internal NLB's (with "
            "tls_certificate_arn: an NLB logs TLS listeners only), under <cluster_name>/nlb/. Its bucket policy "
            "must admit both log delivery services; the stack does not own it, so the logs outlive cdk destroy."
        ),
        json_schema_extra=_hint(
            "an S3 bucket's name: 3-63 lowercase letters, digits, '.' or '-', starting and ending with a letter "
            "or digit",
            means="no access logs",
        ),
    )
    gcs_fault_tolerance: bool = Field(
        True,
        description=(
            "Ray head fault tolerance: the head's GCS keeps the cluster's state in an ElastiCache for Valkey "
            "replication group the stack creates (TLS, auth token in Secrets Manager, encrypted, deleted on "
            "destroy), so a restarted head resumes the cluster while the replicas keep serving "
            "(docs/features/failures.md). false: a head restart rebuilds the whole Ray cluster."
        ),
        json_schema_extra=_hint("true or false"),
    )
    gcs_store_node_type: str = Field(
        "cache.t4g.small",
        pattern=r"^cache\.[a-z0-9]+\.[a-z0-9]+$",
        description="ElastiCache node type of the GCS store (gcs_fault_tolerance).",
        json_schema_extra=_hint("an ElastiCache node type such as cache.t4g.small or cache.m7g.large"),
    )
    gcs_store_replicas: int = Field(
        1,
        ge=0,
        le=5,
        description=(
            "Replicas of the GCS store besides its primary, each in another AZ: with one or more, ElastiCache "
            "fails over to one by itself (Multi-AZ). 0: a single node, and the store's own failure is a head "
            "failure without fault tolerance."
        ),
        json_schema_extra=_hint("a whole number from 0 to 5"),
    )
    ray_upgrade_strategy: Literal["recreate", "manual", "NewCluster"] = Field(
        "recreate",
        description=(
            "How a change reaches the running Ray cluster (docs/guides/updates.md). Serve-config changes are "
            "applied in place under each. recreate: a cluster-config change rebuilds the RayCluster inside cdk "
            "deploy (the rollout Job deletes it, KubeRay builds it from the new spec, the deploy waits until it "
            "serves: downtime while the engines load), worker bounds are set in place. manual: KubeRay's None, "
            "the RayCluster keeps its spec until you recreate it (None is the former name). NewCluster: a second "
            "Ray cluster is built beside the first (needs spare GPU nodes)."
        ),
        json_schema_extra=_hint("recreate, manual or NewCluster"),
    )
    kv_pull_guard: Literal["auto", "on", "off"] = Field(
        "auto",
        description=(
            "Decode's guard against answers from KV that never arrived (docs/features/failures.md). From the "
            "first failed KV pull, decode refuses every request without a first token with HTTP 503 and fails "
            "its health check, so Serve replaces it. auto: on where the engine's vLLM is older than 0.30 (the "
            "default image's 0.26 answers from unwritten KV), standing aside where vLLM handles a failed pull "
            "itself, decided as each decode replica starts; on: always; off: Ray's own engine."
        ),
        json_schema_extra=_hint("auto, on or off"),
    )
    pd_failover: bool = Field(
        True,
        description=(
            "The PD pair fails over to the engine still standing (docs/features/failures.md): decode "
            "prefills locally when prefill has no replica, fails or times out; the prefill engine serves a "
            "request whole when decode has no replica or refuses it before its first token; neither: HTTP 503 "
            "with Retry-After at once. false: Ray's own build_pd_openai_app (every request needs both)."
        ),
        json_schema_extra=_hint("true or false"),
    )
    failover_wait_s: float = Field(
        2.0,
        gt=0,
        le=60,
        description=(
            "The longest a request waits for a replica of one engine before it goes to the other (so at most "
            "twice this in all before a 503); Serve's router would otherwise hold it until a replacement starts."
        ),
        json_schema_extra=_hint("seconds, above 0 and at most 60"),
    )
    failover_prefill_timeout_s: float = Field(
        30.0,
        gt=0,
        le=600,
        description=(
            "How long decode waits for prefill's answer (the prompt's KV) before it prefills the request itself."
        ),
        json_schema_extra=_hint("seconds, above 0 and at most 600"),
    )
    short_prompt_tokens: int = Field(
        128,
        ge=0,
        description=(
            "Conditional disaggregation: prompts of at most this many tokens (as decode's tokenizer counts them, "
            "chat template included) are served on decode alone, skipping the KV transfer; 0: every prompt is "
            "prefilled remotely. 128: the prompts of the 2026-11-30 GPU bench, whose prefill did "
            "not stall the colocated engine's streams (the 3,000-token ones did) and cost 205 ms more time to "
            "first token through PD. Needs pd_failover."
        ),
        json_schema_extra=_hint("a whole number of tokens, 0 or more"),
    )
    kv_buffer_device: Literal["cuda", "cpu"] = Field(
        "cuda",
        description="Where NIXL stages KV blocks; cpu where GPUDirect RDMA is missing.",
        json_schema_extra=_hint("cuda or cpu"),
    )


# The settings reference's sections, one per feature (docs/reference/settings.md is generated in
# this order): every setting in exactly one, none above ~15 (tests/unit/test_docs.py holds both).
SECTIONS: dict[str, tuple[str, ...]] = {
    "Cluster and network": (
        "cluster_name", "kubernetes_version", "region", "availability_zones", "nat_gateways",
        "endpoint_allowed_cidrs", "admin_role_arn", "system_instance_type", "system_node_count",
        "system_root_volume_gib", "log_retention_days",
    ),
    "GPU nodes and capacity": (
        "gpu_availability_zone", "gpu_instance_type", "gpu_node_count", "gpu_root_volume_gib", "fast_image_pull",
        "node_cache", "gpu_layout", "gpu_worker_privileged",
        "prefill_gpu_instance_type", "prefill_gpu_node_count", "decode_gpu_instance_type",
        "decode_gpu_node_count", "gpu_capacity", "prefill_capacity", "decode_capacity",
    ),
    "Model and weights": (
        "model_id", "model_source", "model_config_json", "model_revision", "weights_source",
        "hf_token_secret", "served_models", "model_bucket_removal", "shared_compile_cache", "max_model_len", "dtype",
        "multimodal",
    ),
    "Engines": (
        "gpu_memory_utilization", "quantization", "prefill_enforce_eager", "decode_enforce_eager",
        "prefill_max_num_seqs", "decode_max_num_seqs", "prefill_replicas", "decode_replicas",
        "prefill_tensor_parallel_size", "decode_tensor_parallel_size",
    ),
    "KV transfer": ("kv_backend", "kv_buffer_device", "kv_pull_guard"),
    "Failover": ("pd_failover", "failover_wait_s", "failover_prefill_timeout_s", "short_prompt_tokens"),
    "Ray cluster and updates": ("namespace", "ray_service_name", "image", "ray_upgrade_strategy"),
    "Head fault tolerance": ("gcs_fault_tolerance", "gcs_store_node_type", "gcs_store_replicas"),
    "Endpoint and API keys": (
        "endpoint_exposure", "endpoint_client_cidrs", "tls_certificate_arn", "access_logs_bucket", "api_keys",
        "api_keys_secret_arn", "api_keys_refresh_s", "api_keys_max_stale_s", "trust_request_chat_template",
        "max_request_body_mib",
    ),
    "Autoscaling (all off by default: the counts above stay fixed)": (
        "autoscaling", "prefill_min_replicas", "prefill_max_replicas", "decode_min_replicas",
        "decode_max_replicas", "prefill_target_ongoing_requests", "decode_target_ongoing_requests",
        "gpu_min_node_count", "gpu_max_node_count", "prefill_gpu_min_node_count", "prefill_gpu_max_node_count",
        "decode_gpu_min_node_count", "decode_gpu_max_node_count",
    ),
    "Observability": ("observability", "cloudwatch_addon_version", "alarm_email"),
}  # fmt: skip
