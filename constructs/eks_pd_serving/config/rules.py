"""Rules across settings: combinations that cannot work although each value is fine alone.
Each is a small function of the settings (``config``, being validated: these run from
DeploymentConfig's model validator) that raises one line naming every setting involved and the
fix; ``RULES`` runs them in order."""

from __future__ import annotations

from collections.abc import Callable

from .. import versions
from ..catalog import GATED, INSTANCE_TYPES, MODELS, ModelFacts
from ..layout import RAY_HEAD_CPU_M, GpuGroup
from ..lifecycle.needs import RAY_AUTOSCALER_DEFAULT_CPU_M, allocatable_cpu_m
from ..phase import PHASES, Phase
from ..sizing import GIB, IMAGE_DISK_GIB, checkpoint_bytes, root_volume_needed_gib
from . import derived
from .fields import az_region
from .phases import phase_settings
from .served_models import MOST_MODELS, app_prefixes
from .settings import Settings

# Without availability_zones the VPC spans the region's first two AZs.
DEFAULT_AZ_COUNT = 2


def _check_azs(config: Settings) -> None:
    azs = config.availability_zones
    if config.region and azs and az_region(azs[0]) != config.region:
        raise ValueError(
            f"availability_zones={','.join(azs)!r} are not in region={config.region!r}. "
            f"Fix: list AZs of {config.region}"
        )
    if config.gpu_availability_zone:
        gpu_az = config.gpu_availability_zone
        if config.region and az_region(gpu_az) != config.region:
            raise ValueError(
                f"gpu_availability_zone={gpu_az!r} is not in region={config.region!r}. "
                f"Fix: choose an AZ of {config.region}"
            )
        if not azs:
            raise ValueError(
                f"gpu_availability_zone={gpu_az!r} needs availability_zones too. Fix: also set "
                f"availability_zones to two or more AZs of {az_region(gpu_az)} including {gpu_az}"
            )
        if gpu_az not in azs:
            raise ValueError(
                f"gpu_availability_zone={gpu_az!r} is not one of availability_zones="
                f"{','.join(azs)!r}. Fix: add it to availability_zones or pick one of them"
            )


def _check_nat_gateways(config: Settings) -> None:
    azs = config.availability_zones
    az_count = len(azs) if azs else DEFAULT_AZ_COUNT
    if config.nat_gateways > az_count:
        raise ValueError(
            f"nat_gateways={config.nat_gateways} exceeds the {az_count} AZs of the VPC. "
            f"Fix: set nat_gateways from 1 to {az_count}"
        )


def _check_arn_region(config: Settings, key: str) -> None:
    """An ARN setting's resource must be in the deployment's region (when it is known)."""
    arn, region = getattr(config, key), config.region
    if arn and region and arn.split(":")[3] != region:
        raise ValueError(f"{key}={arn!r} is in {arn.split(':')[3]}, not region={region!r}. Fix: use one in {region}")


def _check_endpoint(config: Settings) -> None:
    if config.tls_certificate_arn and not derived.internal_endpoint(config):
        raise ValueError(
            f"tls_certificate_arn={config.tls_certificate_arn!r} needs the internal NLB, not "
            f"endpoint_exposure={config.endpoint_exposure!r}. Fix: set endpoint_exposure=internal, or drop "
            "tls_certificate_arn"
        )
    _check_arn_region(config, "tls_certificate_arn")
    if config.endpoint_client_cidrs and not derived.internal_endpoint(config):
        raise ValueError(
            f"endpoint_client_cidrs={','.join(config.endpoint_client_cidrs)!r} has no effect with "
            f"endpoint_exposure={config.endpoint_exposure!r}. Fix: set endpoint_exposure=internal, "
            "or drop endpoint_client_cidrs"
        )
    if config.access_logs_bucket and config.weights_source != "s3" and not config.tls_certificate_arn:
        raise ValueError(
            f"access_logs_bucket={config.access_logs_bucket!r} has nothing to log: no weights bucket "
            f"(weights_source={config.weights_source!r}) and no TLS listener on an NLB (an NLB logs TLS only). "
            "Fix: set weights_source=s3 or tls_certificate_arn, or drop access_logs_bucket"
        )
    region = config.region or ""
    other_partition = region.startswith("cn-") or "-gov-" in region or "-iso" in region
    if derived.internal_endpoint(config) and other_partition:
        raise ValueError(
            f"endpoint_exposure='internal' in region={config.region!r}: the AWS Load Balancer Controller policy "
            "shipped here is the release's commercial-partition one (arn:aws:...). Fix: use "
            "endpoint_exposure=port-forward in this partition"
        )


def _check_api_keys(config: Settings) -> None:
    _check_arn_region(config, "api_keys_secret_arn")
    if config.api_keys_max_stale_s < 2 * config.api_keys_refresh_s:
        raise ValueError(
            f"api_keys_max_stale_s={config.api_keys_max_stale_s} is under two reads at "
            f"api_keys_refresh_s={config.api_keys_refresh_s}: one late read would refuse every key. Fix: set "
            f"api_keys_max_stale_s to {2 * config.api_keys_refresh_s} or more"
        )
    if config.api_keys_secret_arn and not derived.api_keys_on(config):
        raise ValueError(
            f"api_keys_secret_arn={config.api_keys_secret_arn!r} is unused with api_keys off. Fix: set "
            "api_keys=true, or drop api_keys_secret_arn"
        )


def _check_failover(config: Settings) -> None:
    if config.pd_failover:
        if config.short_prompt_tokens >= config.max_model_len:
            raise ValueError(
                f"short_prompt_tokens={config.short_prompt_tokens} is not under max_model_len={config.max_model_len}: "
                "every prompt would skip prefill. Fix: set short_prompt_tokens below max_model_len, or 0"
            )
        return
    for key in ("failover_wait_s", "failover_prefill_timeout_s", "short_prompt_tokens"):
        if key in config.model_fields_set:
            raise ValueError(
                f"{key}={getattr(config, key)!r} has no effect with pd_failover=false. Fix: set pd_failover=true, "
                f"or remove {key}"
            )


def _check_request_body(config: Settings) -> None:
    needed = derived.body_bytes_needed(config.max_model_len)
    if config.max_request_body_mib is not None and config.max_request_body_mib * 2**20 < needed:
        raise ValueError(
            f"max_request_body_mib={config.max_request_body_mib} cannot hold a prompt of max_model_len="
            f"{config.max_model_len} tokens as JSON ({needed / 2**20:.1f} MiB). Fix: set max_request_body_mib to "
            f"{-(-needed // 2**20)} or more, or lower max_model_len"
        )


def _check_gcs_store(config: Settings) -> None:
    if not config.gcs_fault_tolerance:
        for key in ("gcs_store_node_type", "gcs_store_replicas"):
            if key in config.model_fields_set:
                raise ValueError(
                    f"{key}={getattr(config, key)!r} has no store to size with gcs_fault_tolerance=false. Fix: set "
                    f"gcs_fault_tolerance=true, or remove {key}"
                )
        return
    needed = versions.ENV_FILES_KUBERNETES_VERSION
    if int(config.kubernetes_version.split(".")[1]) < int(needed.split(".")[1]):
        raise ValueError(
            f"gcs_fault_tolerance=true needs Kubernetes {needed} or later (the head reads the store's token "
            f"through env files), not kubernetes_version={config.kubernetes_version!r}. Fix: set "
            f"kubernetes_version={needed} or later, or gcs_fault_tolerance=false"
        )


def _check_observability(config: Settings) -> None:
    if config.alarm_email and not config.observability:
        raise ValueError(
            f"alarm_email={config.alarm_email!r} has no alarms to send with observability=false. "
            "Fix: set observability=true, or remove alarm_email"
        )
    if "cloudwatch_addon_version" in config.model_fields_set and not config.observability:
        raise ValueError(
            f"cloudwatch_addon_version={config.cloudwatch_addon_version!r} has no add-on to pin with "
            "observability=false. Fix: set observability=true, or remove cloudwatch_addon_version"
        )


AUTOSCALING_KEYS = ("prefill_min_replicas", "prefill_max_replicas", "decode_min_replicas", "decode_max_replicas",
                    "prefill_target_ongoing_requests", "decode_target_ongoing_requests", "gpu_min_node_count",
                    "gpu_max_node_count", "prefill_gpu_min_node_count", "prefill_gpu_max_node_count",
                    "decode_gpu_min_node_count", "decode_gpu_max_node_count")  # fmt: skip
# Fixed counts that autoscaling replaces, each with the settings that take its place.
_FIXED_COUNTS = {
    "prefill_replicas": "prefill_min_replicas and prefill_max_replicas",
    "decode_replicas": "decode_min_replicas and decode_max_replicas",
    "gpu_node_count": "gpu_min_node_count and gpu_max_node_count",
    "prefill_gpu_node_count": "prefill_gpu_min_node_count and prefill_gpu_max_node_count",
    "decode_gpu_node_count": "decode_gpu_min_node_count and decode_gpu_max_node_count",
}


def _check_upgrade_strategy(config: Settings) -> None:
    """NewCluster builds the new Ray cluster's head beside the running one: the system node group
    (min = max, never scaled) must hold two heads until KubeRay switches over."""
    system = INSTANCE_TYPES.get(config.system_instance_type)
    if config.ray_upgrade_strategy != "NewCluster" or system is None or config.system_node_count >= 2:
        return
    head_m = RAY_HEAD_CPU_M + (RAY_AUTOSCALER_DEFAULT_CPU_M if config.autoscaling else 0)
    allocatable_m = allocatable_cpu_m(system.vcpus)
    if 2 * head_m > allocatable_m:
        raise ValueError(
            f"ray_upgrade_strategy='NewCluster' with system_node_count={config.system_node_count}: the new "
            f"cluster's Ray head ({head_m / 1000:g} CPU) must run beside the first until KubeRay switches "
            f"over, and one {config.system_instance_type} has {allocatable_m / 1000:g} CPU allocatable, so the "
            "update never completes. Fix: set system_node_count=2 (or a larger system_instance_type), or "
            "ray_upgrade_strategy=recreate"
        )


def _check_capacity(config: Settings) -> None:
    """Spot for prefill alone, reservations in a known AZ, a Capacity Block at its fixed count."""
    for key in ("prefill_capacity", "decode_capacity"):
        if getattr(config, key) is not None and config.gpu_layout != "per_phase":
            raise ValueError(
                f"{key}={getattr(config, key)!r} has no effect with gpu_layout={config.gpu_layout!r}. Fix: set "
                "gpu_layout=per_phase, or use gpu_capacity"
            )
    for group in derived.gpu_groups(config):
        capacity, key = derived.gpu_capacity(config, group), derived.capacity_setting(config, group)
        if capacity.kind == "spot" and Phase.DECODE in group.phases:
            raise ValueError(
                f"{key}='spot' for the group that runs decode: a spot interruption ends every stream it holds. "
                "Fix: set gpu_layout=per_phase and prefill_capacity=spot, keeping decode on-demand or reserved"
            )
        if capacity.reserved and not config.gpu_availability_zone:
            raise ValueError(
                f"{key}={str(capacity)!r} without gpu_availability_zone: the node group must launch in the "
                "reservation's AZ. Fix: set gpu_availability_zone to it (preflight reads it and writes it)"
            )
        if capacity.kind == "capacity-block" and config.autoscaling:
            raise ValueError(
                f"{key}={str(capacity)!r} with autoscaling=true: a Capacity Block is a fixed count for a fixed "
                "window, so its group is pinned at the block's count. Fix: set autoscaling=false, or another capacity"
            )


def _shown(config: Settings, key: str, value: object) -> str:
    """'key=value', marked as the default when the setting was not given."""
    return f"{key}={value}" + ("" if getattr(config, key) is not None else " (default)")


def _check_autoscaling(config: Settings) -> None:
    if not config.autoscaling:
        for key in AUTOSCALING_KEYS:
            if getattr(config, key) is not None:
                raise ValueError(
                    f"{key}={getattr(config, key)!r} is only used with autoscaling=true. "
                    f"Fix: set autoscaling=true, or remove {key}"
                )
        return
    for key, replacement in _FIXED_COUNTS.items():
        if key in config.model_fields_set:
            raise ValueError(
                f"{key}={getattr(config, key)!r} is a fixed count, but autoscaling=true moves it between "
                f"{replacement}. Fix: remove {key} and set those"
            )
    other_layout = "prefill_gpu_" if config.gpu_layout == "shared" else "gpu_"
    for key in AUTOSCALING_KEYS:
        if key.startswith(other_layout) and "node_count" in key and getattr(config, key) is not None:
            raise ValueError(
                f"{key}={getattr(config, key)!r} does not apply to gpu_layout={config.gpu_layout!r}. "
                f"Fix: remove {key}" + (", or set gpu_layout=per_phase" if config.gpu_layout == "shared" else "")
            )
    if config.gpu_layout == "shared":
        for key in ("decode_gpu_min_node_count", "decode_gpu_max_node_count"):
            if getattr(config, key) is not None:
                raise ValueError(
                    f"{key}={getattr(config, key)!r} does not apply to gpu_layout='shared'. "
                    f"Fix: remove {key}, or set gpu_layout=per_phase"
                )
    for phase in PHASES:
        _check_bounds(config, (f"{phase}_min_replicas", f"{phase}_max_replicas"), derived.replica_bounds(config, phase))
    for group in derived.gpu_groups(config):
        _check_bounds(config, derived.bound_settings(group), (group.min_node_count, group.max_node_count))
        for bound in (0, 1):
            if error := _gpu_shortfall(config, group, bound):
                raise error


def _check_bounds(config: Settings, keys: tuple[str, str], bounds: tuple[int, int]) -> None:
    """A lower bound (``keys[0]``, given or default) above its upper bound is refused."""
    (low_key, high_key), (low, high) = keys, bounds
    if low > high:
        raise ValueError(
            f"{_shown(config, low_key, low)} exceeds {_shown(config, high_key, high)}. "
            f"Fix: set {low_key} at most {high_key}"
        )


def _gpu_shortfall(config: Settings, group: GpuGroup, bound: int | None = None) -> ValueError | None:
    """The one message for a group whose nodes have fewer GPUs than its phases ask, or None when
    they fit: a fixed group (``bound`` None) at its node count, an autoscaled one at its fewest
    (``bound`` 0) or most (1) nodes and replicas."""
    if bound is None:
        key, nodes = derived.count_setting(group), group.node_count
        shown, at, lower = f"{key}={nodes}", "", "replicas"
        replicas = [f"{p}_replicas={phase_settings(config, p).replicas}" for p in group.phases]
    else:
        end = ("min", "max")[bound]
        key, nodes = derived.bound_settings(group)[bound], (group.min_node_count, group.max_node_count)[bound]
        shown, at = _shown(config, key, nodes), f" at the {('fewest', 'most')[bound]} replicas"
        lower = " and ".join(f"{p}_{end}_replicas" for p in group.phases)
        replicas = [
            _shown(config, f"{p}_{end}_replicas", derived.replica_bounds(config, p)[bound]) for p in group.phases
        ]
    wanted = sum(derived.gpus_for(config, p, bound or 0) for p in group.phases)
    per_node = group.instance.gpus
    if wanted <= nodes * per_node:
        return None
    asked = " + ".join(
        f"{phase_replicas} x {p}_tensor_parallel_size={phase_settings(config, p).tensor_parallel_size}"
        for phase_replicas, p in zip(replicas, group.phases, strict=True)
    )
    if (models := len(derived.served_models(config))) > 1:
        asked, lower = f"({asked}) x {models} served models", f"{lower} or serve fewer models (served_models)"
    return ValueError(
        f"{asked} needs {wanted} GPUs{at}, but {shown} x {group.instance_type} has {nodes * per_node}. "
        f"Fix: raise {key} to {-(-wanted // per_node)} or lower {lower}"
    )


def _check_gpus(config: Settings) -> None:
    per_phase_keys = ("prefill_gpu_instance_type", "prefill_gpu_node_count", "decode_gpu_instance_type",
                      "decode_gpu_node_count")  # fmt: skip
    if config.gpu_layout == "shared":
        for key in per_phase_keys:
            if getattr(config, key) is not None:
                raise ValueError(
                    f"{key}={getattr(config, key)!r} is only used with gpu_layout='per_phase'. "
                    f"Fix: set gpu_layout=per_phase, or remove {key}"
                )
    for phase in PHASES:
        tp = phase_settings(config, phase).tensor_parallel_size
        group = derived.gpu_group(config, phase)
        per_node = group.instance.gpus
        if tp > per_node:
            raise ValueError(
                f"{phase}_tensor_parallel_size={tp} exceeds the {per_node} GPU(s) of one "
                f"{group.instance_type} (tensor parallelism stays inside a node). Fix: lower "
                f"it to {per_node} or choose an instance type with more GPUs"
            )
    for group in derived.gpu_groups(config):
        if group.autoscaled:  # judged against its bounds in _check_autoscaling
            continue
        if error := _gpu_shortfall(config, group):
            raise error


def _check_model(config: Settings) -> None:
    facts = derived.model_facts(config)
    if facts is None:
        raise ValueError(
            f"model_source={config.model_source!r} is not in the model catalogue ({', '.join(MODELS)}) and "
            "model_config_json is not set: synth cannot size it, and an engine that does not fit fails on the "
            "cluster half an hour into the deploy. Fix: set model_config_json to the model's config.json from "
            "its Hugging Face repository"
        )
    _check_fit(config, facts, config.model_source)


def _check_served_models(config: Settings) -> None:
    """Each entry of ``served_models``: an id of its own, a catalogue model (synth sizes it), one
    that fits each phase's GPU with the engine settings, and a Hub token where it is gated. Its
    GPUs are counted with the others' by ``_check_gpus``."""
    chosen = derived.served_models(config)
    if len(chosen) > MOST_MODELS:
        raise ValueError(
            f"served_models names {len(chosen) - 1} models; with model_source that is {len(chosen)}, and one "
            f"RayService serves at most {MOST_MODELS} (each phase's NIXL ports). Fix: serve fewer models"
        )
    if len(chosen) > 1 and not config.pd_failover:
        raise ValueError(
            "served_models needs pd_failover=true: several models are served as applications of their own behind "
            "the failover's one ingress (Ray's build_pd_openai_app serves one). Fix: set pd_failover=true, or "
            "empty served_models"
        )
    for key, taken in (("model id", [c.model_id for c in chosen]), ("Serve application prefix", app_prefixes(chosen))):
        for index, value in enumerate(taken[1:], start=1):
            if value in taken[:index]:
                raise ValueError(
                    f"served_models entry {chosen[index]} has the {key} {value!r} of "
                    f"{chosen[taken.index(value)]}. Fix: give it a model_id of its own"
                )
    for choice in chosen[1:]:
        entry = f"served_models entry {choice}"
        facts = derived.facts_of(config, choice)
        if facts is None:
            raise ValueError(
                f"{entry}: {choice.repository} is not in the model catalogue ({', '.join(MODELS)}), so synth cannot "
                "size it. Fix: serve a catalogue model there, or serve this one as model_source with model_config_json"
            )
        if choice.repository in GATED and not (config.weights_source == "s3" and config.hf_token_secret):
            raise ValueError(
                f"{entry}: {choice.repository} is gated on the Hugging Face Hub and needs a token. Fix: set "
                "weights_source=s3 and hf_token_secret"
            )
        try:
            _check_fit(config, facts, choice.repository)
            _check_pd_facts(config, facts)
        except ValueError as error:
            raise ValueError(f"{entry}: {error}") from None


def _check_fit(config: Settings, facts: ModelFacts, source: str) -> None:
    """``source`` (its ``facts``) at max_model_len, on each phase's GPU with its engine settings."""
    if config.max_model_len > facts.max_model_len:
        raise ValueError(
            f"max_model_len={config.max_model_len} exceeds {source}'s own maximum "
            f"of {facts.max_model_len}. Fix: set max_model_len to at most {facts.max_model_len}"
        )
    for phase in PHASES:
        sizing = derived.sizing(config, phase, facts)
        assert sizing is not None
        group, tp = derived.gpu_group(config, phase), phase_settings(config, phase).tensor_parallel_size
        type_key = derived.type_setting(config, group)
        if sizing.short_of_mamba_blocks and sizing.num_blocks > 0:
            raise ValueError(
                f"{phase}_max_num_seqs={sizing.max_num_seqs} with {phase}_enforce_eager=false: vLLM needs a Mamba "
                f"cache block per decode sequence with CUDA graphs, and the KV cache of {type_key}="
                f"{group.instance_type} holds {sizing.num_blocks} (vLLM refuses to start). Fix: set "
                f"{phase}_max_num_seqs to at most {sizing.num_blocks} (or leave it to the sizing), or "
                f"{phase}_enforce_eager=true"
            )
        for problem in sizing.problems():
            raise ValueError(
                f"max_model_len={config.max_model_len} with dtype={config.dtype}, gpu_memory_utilization="
                f"{config.gpu_memory_utilization} and {phase}_tensor_parallel_size="
                f"{tp} on {type_key}={group.instance_type}: {problem}. Fix: lower max_model_len, raise the "
                "tensor-parallel size, or choose a GPU with more memory"
            )


def _check_root_volume(config: Settings) -> None:
    """The mirror writes the checkpoint under the container's model cache, on the GPU node's root
    volume beside the image; kubelet evicts the pod once less than 10% is free."""
    facts = derived.model_facts(config)
    if facts is None:
        return
    need = root_volume_needed_gib(facts)
    if config.gpu_root_volume_gib < need:
        raise ValueError(
            f"gpu_root_volume_gib={config.gpu_root_volume_gib} cannot hold {config.model_source}'s checkpoint "
            f"({checkpoint_bytes(facts) / GIB:.0f} GiB, written under the container's model cache), the image "
            f"(about {IMAGE_DISK_GIB} GiB) and kubelet's 10% eviction margin: the worker pods are evicted as "
            f"the model downloads. Fix: set gpu_root_volume_gib to at least {need} "
            f"({root_volume_needed_gib(facts, copies=2)} also holds a model_revision change)"
        )


def _check_gated_model(config: Settings) -> None:
    """A gated model's files need a Hub token, which only the staging job can be given."""
    if config.model_source not in GATED or (config.weights_source == "s3" and config.hf_token_secret):
        return
    fix = (
        "set hf_token_secret to a Secrets Manager secret holding a token of an account that accepted the license"
        if config.weights_source == "s3"
        else "set weights_source=s3 and hf_token_secret (the engines cannot be given a token)"
    )
    raise ValueError(
        f"model_source={config.model_source!r} is gated on the Hugging Face Hub and hf_token_secret is not set "
        f"(weights_source={config.weights_source}): the download is refused (401) and the deploy rolls back. "
        f"Fix: {fix}"
    )


def _check_pd_compatibility(config: Settings) -> None:
    """vLLM 0.26's NIXL compatibility matrix (docs/features/nixl_connector_compatibility.md) and the
    connector's handshake checks (distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py,
    ``_validate_remote_agent_handshake``), per architecture class. Tensor-parallel sizes of 1, 2, 4
    and 8 always divide each other, which the handshake also asserts; the model, dtype and KV-cache
    dtype are one setting for both phases, so the compatibility hash cannot differ."""
    facts = derived.model_facts(config)
    if facts is not None:
        _check_pd_facts(config, facts)


def _check_pd_facts(config: Settings, facts: ModelFacts) -> None:
    prefill_tp, decode_tp = config.prefill_tensor_parallel_size, config.decode_tensor_parallel_size
    if facts.hybrid and prefill_tp != decode_tp:
        raise ValueError(
            f"prefill_tensor_parallel_size={prefill_tp} and decode_tensor_parallel_size={decode_tp} differ, but "
            f"{config.model_source} is a hybrid (Gated DeltaNet) model and vLLM's NIXL connector supports only "
            "the same size on both for its Mamba layers. Fix: set them equal"
        )
    if prefill_tp > decode_tp and prefill_tp > facts.num_kv_heads:
        raise ValueError(
            f"prefill_tensor_parallel_size={prefill_tp} exceeds decode_tensor_parallel_size={decode_tp} and the "
            f"{facts.num_kv_heads} KV heads of {config.model_source}: prefill's ranks then hold replicated KV heads, "
            "which vLLM's NIXL connector cannot read into fewer decode ranks (its handshake asserts). Fix: set "
            f"decode_tensor_parallel_size to {prefill_tp}, or prefill_tensor_parallel_size to at most "
            f"{max(facts.num_kv_heads, decode_tp)}"
        )


RULES: tuple[Callable[[Settings], None], ...] = (
    _check_azs,
    _check_nat_gateways,
    _check_endpoint,
    _check_api_keys,
    _check_failover,
    _check_gcs_store,
    _check_observability,
    _check_autoscaling,
    _check_upgrade_strategy,
    _check_capacity,
    _check_gpus,
    _check_model,
    _check_served_models,
    _check_root_volume,
    _check_gated_model,
    _check_pd_compatibility,
    _check_request_body,
)


def check_all(config: Settings) -> None:
    """Every rule across settings, in order; the first broken one raises."""
    for rule in RULES:
        rule(config)
