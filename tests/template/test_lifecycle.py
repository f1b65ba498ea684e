"""The lifecycle rules over every variant of the template, each shown failing on the template as
it was before its fix (tests/fixtures/lifecycle/before-fixes/, synthesized from commit f41ff6f
with the same settings; before-runtime-fixes/ from 1952631; before-rollout-fixes/ from 3b67cfd;
before-failover-fixes/ from 0a5e276), and the model itself on small hand-written templates."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from support import FIXTURES, synth_assembly

from eks_pd_serving.config import ConfigError, DeploymentConfig
from eks_pd_serving.lifecycle import facts, rules
from eks_pd_serving.lifecycle.graph import StackModel
from eks_pd_serving.lifecycle.needs import allocatable_cpu_m, named_log_groups

BEFORE = FIXTURES / "lifecycle" / "before-fixes"
BEFORE_RUNTIME = FIXTURES / "lifecycle" / "before-runtime-fixes"
BEFORE_ROLLOUT = FIXTURES / "lifecycle" / "before-rollout-fixes"
BEFORE_FAILOVER = FIXTURES / "lifecycle" / "before-failover-fixes"
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "internal": {"endpoint_exposure": "internal"},
    "autoscaling": {"autoscaling": True},
    "per_phase": {"gpu_layout": "per_phase"},
    "observability_off": {"observability": False},
    "new_cluster": {"ray_upgrade_strategy": "NewCluster", "system_node_count": 2},
    "gcs_ft_off": {"gcs_fault_tolerance": False},
    "api_keys": {"api_keys": True},
    "kv_guard_off": {"kv_pull_guard": "off"},
    "node_cache_off": {"node_cache": False, "fast_image_pull": False},
    "odcr": {"gpu_capacity": "odcr:cr-0123456789abcdef0",
             "availability_zones": "us-east-1a,us-east-1b", "gpu_availability_zone": "us-east-1a"},
    "autoscaling_decode_max_3": {"autoscaling": True, "decode_max_replicas": 3},
    "capacity_block": {"gpu_layout": "per_phase", "decode_capacity": "capacity-block:cr-0123456789abcdef0",
                       "availability_zones": "us-east-1a,us-east-1b", "gpu_availability_zone": "us-east-1a"},
    "second_model": {"gpu_node_count": 4, "served_models": "qwen3-8b=Qwen/Qwen3-8B@main"},
    # The longest service name the settings accept: the rollout Job's name must still fit a label.
    "long_name": {"ray_service_name": "a" * 40},
    "all": {"endpoint_exposure": "internal", "autoscaling": True, "gpu_layout": "per_phase",
            "alarm_email": "ops@example.com"},
}  # fmt: skip


@pytest.fixture(scope="module")
def variants(tmp_path_factory: pytest.TempPathFactory) -> dict[str, StackModel]:
    found = {}
    for name, settings in VARIANTS.items():
        path = synth_assembly(tmp_path_factory.mktemp(name), nag=False, **settings)
        found[name] = StackModel(json.loads(path.read_text()))
    return found


def before(name: str, folder: Path = BEFORE) -> StackModel:
    return StackModel(json.loads(gzip.decompress((folder / f"{name}.template.json.gz").read_bytes())))


def _ids(model: StackModel, type_: str, **properties: Any) -> list[str]:
    return sorted(r.id for r in model.of_type(type_) if all(r.properties.get(k) == v for k, v in properties.items()))


# --- every rule, every variant ------------------------------------------------------------------


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_lifecycle_rule_holds_on_every_variant(variants: dict[str, StackModel], variant: str) -> None:
    config = DeploymentConfig.create(**VARIANTS[variant])
    preflighted = named_log_groups(config.cluster_name, observability=config.observability)
    assert [str(f) for f in rules.check(variants[variant], preflighted)] == []


# A renamed service is another service (every object's name moves), not an update of this one.
@pytest.mark.parametrize("variant", sorted(set(VARIANTS) - {"default", "long_name"}))
def test_every_update_rule_holds_when_a_setting_flips_either_way(variants: dict[str, StackModel], variant: str) -> None:
    pairs = ((variants["default"], variants[variant]), (variants[variant], variants["default"]))
    found = [f for rule in rules.UPDATE_RULES.values() for old, new in pairs for f in rule(old, new)]
    assert [str(f) for f in found] == []


def test_the_update_from_the_one_manifest_layout_moves_the_namespace_before_any_prune(
    variants: dict[str, StackModel],
) -> None:
    assert rules.moved_objects_applied_before_prune(before("default", BEFORE_RUNTIME), variants["default"]) == []


def test_the_rules_cover_every_variant_the_issue_names() -> None:
    # Default, internal, autoscaling, per_phase, observability off, and all options at once.
    assert {"default", "internal", "autoscaling", "per_phase", "observability_off", "all"} <= set(VARIANTS)
    assert len(rules.TEMPLATE_RULES) == 20 and len(rules.UPDATE_RULES) == 4


# --- each defect, failing on the template before its fix ------------------------------------------


def _found(model: StackModel, rule: str) -> list[rules.Finding]:
    return [f for f in rules.TEMPLATE_RULES[rule](model) if f.rule == rule]


@pytest.mark.parametrize("variant", ["default", "internal"])
def test_kubectl_resources_were_deleted_after_the_api_rule(variant: str) -> None:
    model = before(variant)
    (ingress,) = _ids(model, "AWS::EC2::SecurityGroupIngress", FromPort=443)
    found = _found(model, "kubectl_resources_outlive_api_route")
    manifests = {f.resource for f in found}
    assert set(_ids(model, "Custom::AWSCDK-EKS-KubernetesResource")) <= manifests
    assert set(_ids(model, "Custom::AWSCDK-EKS-HelmChart")) <= manifests
    assert all(f"no dependency on {ingress}" in f.missing for f in found)
    # Nothing depended on the rule: CloudFormation revoked it in the first delete wave.
    assert ingress in model.delete_waves()[0]


def test_now_the_api_rule_goes_after_every_kubectl_resource(variants: dict[str, StackModel]) -> None:
    model = variants["all"]
    (ingress,) = _ids(model, "AWS::EC2::SecurityGroupIngress", FromPort=443)
    kubectl = _ids(model, "Custom::AWSCDK-EKS-KubernetesResource") + _ids(model, "Custom::AWSCDK-EKS-HelmChart")
    assert len(kubectl) == 12 and all(model.deleted_before(r, ingress) for r in kubectl)
    assert ingress not in model.delete_waves()[0]


def test_coredns_went_before_the_load_balancer_controller() -> None:
    model = before("internal")
    ((controller, coredns),) = [
        (c, a) for c in _ids(model, "Custom::AWSCDK-EKS-HelmChart", Release="aws-load-balancer-controller")
        for a in _ids(model, "AWS::EKS::Addon", AddonName="coredns")
    ]  # fmt: skip
    (finding,) = _found(model, "aws_controllers_outlive_dns")
    assert (finding.resource, f"no dependency on {coredns}") == (controller, finding.missing.split(" (")[0])
    assert model.delete_waves()[0].count(coredns) == 1


def test_the_provider_log_groups_were_deleted_before_their_functions() -> None:
    model = before("default")
    found = _found(model, "lambda_log_groups_outlive_their_functions")
    assert sorted(f.resource for f in found) == sorted(
        r.id for r in model.of_type("AWS::Lambda::Function") if r.id.startswith("PdServingClusterKubectlProvider")
    )
    assert all("named after the function, so deleted before it" in f.missing for f in found)


def test_every_lambda_now_names_a_log_group_deleted_after_it(variants: dict[str, StackModel]) -> None:
    model = variants["all"]
    for function in model.of_type("AWS::Lambda::Function"):
        group = function.properties["LoggingConfig"]["LogGroup"]
        assert model.deleted_before(function.id, group["Ref"])


def test_the_ray_scraper_and_the_operator_could_land_on_an_autoscaled_gpu_node() -> None:
    missing = {
        f.missing.split(" has no")[0] for f in _found(before("autoscaling"), "no_unmovable_pods_on_autoscaled_nodes")
    }
    assert missing == {"manager (the add-on's operator)", "agent cloudwatch-agent-ray (deployment)"}


def test_the_pinning_rule_fails_on_a_deployment_agent_without_a_selector(variants: dict[str, StackModel]) -> None:
    model = variants["autoscaling"]
    (addon,) = _ids(model, "AWS::EKS::Addon", AddonName="amazon-cloudwatch-observability")
    config = facts.addon_configuration(model.resources[addon])
    assert config["manager"]["nodeSelector"] == {"kubernetes.io/os": "linux", "role": "system"}
    broken = json.loads(json.dumps(model.template))
    values = broken["Resources"][addon]["Properties"]["ConfigurationValues"]["Fn::Join"][1]
    values[0] = values[0].replace('"manager":{"nodeSelector":{"kubernetes.io/os":"linux","role":"system"}},', "")
    assert [f.resource for f in _found(StackModel(broken), "no_unmovable_pods_on_autoscaled_nodes")] == [addon]


def test_the_system_node_still_holds_what_is_pinned_to_it(variants: dict[str, StackModel]) -> None:
    budget = rules.system_budget(variants["all"])
    assert budget is not None
    # m7i.xlarge: 4 vCPUs less 80m for the kubelet (nodeadm's reservation: 60 + 10 + 5 + 5).
    assert budget.allocatable_m == allocatable_cpu_m(4) == 3920
    assert budget.requested_m <= budget.allocatable_m
    assert "CloudWatch cloudwatch-agent-ray: 100m" in budget.lines and "CloudWatch add-on manager: 100m" in budget.lines


def test_the_budget_rule_fails_when_the_system_node_is_too_small(variants: dict[str, StackModel]) -> None:
    broken = json.loads(json.dumps(variants["all"].template))
    (system,) = [r.id for r in facts.nodegroups_for(variants["all"], {"role": "system"})]
    broken["Resources"][system]["Properties"]["InstanceTypes"] = ["m7i.large"]
    (finding,) = _found(StackModel(broken), "system_nodes_hold_their_pods")
    assert finding.resource == system and "1930m allocatable" in finding.missing


def test_a_workload_that_does_not_wait_for_its_nodes_is_found(variants: dict[str, StackModel]) -> None:
    broken = json.loads(json.dumps(variants["per_phase"].template))
    (ray,) = [k for k, r in broken["Resources"].items() if k.startswith("PdServingClusterRayServiceChart")]
    decode = [g.id for g in facts.nodegroups_for(variants["per_phase"], {"phase": "decode"})]
    assert len(decode) == 1
    # Drop every edge that leads to the decode nodes (directly, or through the device plugins).
    model = variants["per_phase"]
    kept = [d for d in broken["Resources"][ray]["DependsOn"] if d != decode[0] and decode[0] not in model.needs(d)]
    broken["Resources"][ray]["DependsOn"] = kept
    (finding,) = rules.workloads_follow_their_nodes(StackModel(broken))
    assert finding.resource == ray and finding.missing.endswith(f"no dependency on {decode[0]} (its pods run there)")


def test_new_cluster_on_one_system_node_could_never_complete() -> None:
    (finding,) = _found(before("new_cluster"), "new_cluster_upgrade_fits")
    assert "a second Ray head (2000m) does not fit beside the first" in finding.missing


def test_new_cluster_on_one_system_node_is_refused_with_the_setting_and_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"system_node_count=1.*Fix: set system_node_count=2"):
        DeploymentConfig.create(ray_upgrade_strategy="NewCluster")
    with pytest.raises(ConfigError, match=r"Ray head \(2.5 CPU\)"):
        DeploymentConfig.create(ray_upgrade_strategy="NewCluster", autoscaling=True)
    assert DeploymentConfig.create(ray_upgrade_strategy="NewCluster", system_instance_type="m7i.2xlarge")


def test_switching_observability_off_left_the_metrics_policy_in_the_cluster() -> None:
    (finding,) = rules.pruned_objects_leave(before("default"), before("observability_off"))
    assert "NetworkPolicy/inference/ray-metrics-from-scraper leaves the manifest" in finding.missing


def test_the_preflight_rule_fails_when_preflight_misses_a_named_group(variants: dict[str, StackModel]) -> None:
    config = DeploymentConfig.create()
    only_control_plane = named_log_groups(config.cluster_name, observability=False)
    found = rules.named_log_groups_preflighted(variants["default"], only_control_plane)
    assert sorted(f.missing.split()[-1].rsplit("/", 1)[-1] for f in found) == [
        "application", "dataplane", "host", "performance", "prometheus"
    ]  # fmt: skip


def test_turning_keys_off_pruned_the_code_the_running_cluster_mounts() -> None:
    """G3: the key check's ConfigMap was applied only with keys on; the RayCluster built with keys
    (not rebuilt under upgradeStrategy None) mounts it, so its next pod would never start."""
    (finding,) = rules.old_pods_keep_what_they_mount(
        before("api_keys", BEFORE_RUNTIME), before("default", BEFORE_RUNTIME)
    )
    assert finding.missing == (
        "ConfigMap/inference/ray-llm-api-keys-code leaves the cluster while the running RayService/inference/ray-llm's "
        "pods mount it"
    )


def test_the_rule_fails_if_the_kv_guards_code_left_with_the_guard(variants: dict[str, StackModel]) -> None:
    """The guard's ConfigMap is applied with the guard off as well: the workers built while it was
    on mount it. Without it in the off template, turning the guard off strands their next pod."""
    broken = json.loads(json.dumps(variants["kv_guard_off"].template))
    (namespace,) = [k for k in broken["Resources"] if k.startswith("PdServingClusterRayServiceNamespaceChart")]
    properties = broken["Resources"][namespace]["Properties"]
    objects = json.loads(properties["Manifest"])
    properties["Manifest"] = json.dumps([o for o in objects if o["metadata"]["name"] != "ray-llm-kv-guard-code"])
    (finding,) = rules.old_pods_keep_what_they_mount(variants["default"], StackModel(broken))
    assert finding.missing == (
        "ConfigMap/inference/ray-llm-kv-guard-code leaves the cluster while the running RayService/inference/ray-llm's "
        "pods mount it"
    )
    assert rules.old_pods_keep_what_they_mount(variants["default"], variants["kv_guard_off"]) == []


def test_the_namespace_and_the_head_policy_went_with_or_before_the_ray_service() -> None:
    """G5: one `kubectl delete` took the namespace, the head's service account and the RayService,
    and the head role's policy went in the first wave: KubeRay's cleanup Job could not run."""
    model = before("default", BEFORE_RUNTIME)
    (policy,) = [r.id for r in model.of_type("AWS::IAM::Policy") if r.id.startswith("PdServingHeadIdentity")]
    found = _found(model, "ray_clusters_outlive_no_gcs_store")
    assert sorted(f.missing.split(" (")[0] for f in found) == [
        "Namespace/-/inference is deleted with the RayService",
        "ServiceAccount/inference/ray-llm-head is deleted with the RayService",
        f"no dependency on {policy}",
    ]
    assert policy in model.delete_waves()[0]


def test_now_the_namespace_goes_after_the_ray_service_and_its_head_policy_after_both(
    variants: dict[str, StackModel],
) -> None:
    model = variants["default"]
    manifests = _ids(model, "Custom::AWSCDK-EKS-KubernetesResource")
    (service,) = [m for m in manifests if m.startswith("PdServingClusterRayServiceChart")]
    (namespace,) = [m for m in manifests if m.startswith("PdServingClusterRayServiceNamespaceChart")]
    (policy,) = [r.id for r in model.of_type("AWS::IAM::Policy") if r.id.startswith("PdServingHeadIdentity")]
    assert model.deleted_before(service, namespace) and model.deleted_before(service, policy)
    assert model.resources[namespace].properties["Overwrite"] is True


@pytest.mark.parametrize("break_", ["edge", "overwrite"])
def test_the_move_rule_fails_when_the_new_manifest_is_not_applied_first(
    variants: dict[str, StackModel], break_: str
) -> None:
    broken = json.loads(json.dumps(variants["default"].template))
    (namespace,) = [k for k in broken["Resources"] if k.startswith("PdServingClusterRayServiceNamespaceChart")]
    if break_ == "edge":  # every path from the RayService to its namespace (the serve rollout's too)
        for resource in broken["Resources"].values():
            if namespace in resource.get("DependsOn", []):
                resource["DependsOn"].remove(namespace)
    else:
        del broken["Resources"][namespace]["Properties"]["Overwrite"]
    found = rules.moved_objects_applied_before_prune(before("default", BEFORE_RUNTIME), StackModel(broken))
    # What the RayService's manifest applied before (keys off: no ConfigMap yet, which is created).
    moved = [
        "Namespace/-/inference",
        "ServiceAccount/inference/ray-llm-head",
        "ServiceAccount/inference/ray-llm-workers",
    ]
    if break_ == "edge":
        # Only the Namespace is a kind kubectl's prune deletes (ServiceAccounts it never does).
        assert [f.missing.split(" moves")[0].rsplit("(", 1)[1] for f in found] == ["Namespace/-/inference"]
    else:
        assert sorted(f.missing.split(", which")[0].removeprefix("creates ") for f in found) == moved


def test_the_serve_port_admitted_the_whole_vpc_and_not_the_nlb_subnets() -> None:
    found = _found(before("internal"), "serve_port_admits_nlb_subnets")
    policy = "NetworkPolicy/inference/ray-serve-from-clients"
    assert sorted(f.missing.removeprefix(policy + " ") for f in found) == [
        "admits 10.0.0.0/16 beyond the NLB subnets",
        "does not admit NLB subnet ${PdServingNetworkPrivateSubnet1Subnet494C129E} (10.0.32.0/19)",
        "does not admit NLB subnet ${PdServingNetworkPrivateSubnet2SubnetF0A791F7} (10.0.64.0/19)",
    ]


# --- the model on small templates --------------------------------------------------------------

HAND = {
    "Resources": {
        "Vpc": {"Type": "AWS::EC2::VPC", "Properties": {"CidrBlock": "10.0.0.0/16"}},
        "Subnet": {"Type": "AWS::EC2::Subnet", "Properties": {"VpcId": {"Ref": "Vpc"}}},
        "Group": {"Type": "AWS::EC2::SecurityGroup", "Properties": {"VpcId": {"Fn::GetAtt": ["Vpc", "VpcId"]}}},
        "Name": {"Type": "AWS::SSM::Parameter",
                 "Properties": {"Value": {"Fn::Sub": "${Group.GroupId}-${AWS::Region}"}}},
        "Late": {"Type": "AWS::SNS::Topic", "DependsOn": "Name"},
    }
}  # fmt: skip


def test_the_model_reads_ref_getatt_sub_and_depends_on_and_orders_waves_both_ways() -> None:
    model = StackModel(HAND)
    assert model.edges["Name"] == {"Group"} and model.edges["Late"] == {"Name"}
    assert model.create_waves() == [["Vpc"], ["Group", "Subnet"], ["Name"], ["Late"]]
    assert model.delete_waves() == [["Late", "Subnet"], ["Name"], ["Group"], ["Vpc"]]
    assert model.deleted_before("Late", "Vpc") and not model.deleted_before("Vpc", "Late")


def test_the_model_refuses_a_dependency_cycle() -> None:
    cyclic = json.loads(json.dumps(HAND))
    cyclic["Resources"]["Vpc"]["DependsOn"] = ["Late"]
    with pytest.raises(ValueError, match="dependency cycle"):
        StackModel(cyclic).needs("Vpc")


def test_the_rule_registry_is_the_public_list_of_rules() -> None:
    assert set(rules.TEMPLATE_RULES) <= set(rules.__all__)
    assert all(rules.TEMPLATE_RULES[name].__name__ == name for name in rules.TEMPLATE_RULES)


def test_a_reference_inside_a_sub_carries_a_replacement() -> None:
    from eks_pd_serving.lifecycle.changes import compare

    old = json.loads(json.dumps(HAND))
    new = json.loads(json.dumps(HAND))
    new["Resources"]["Group"]["Properties"]["GroupDescription"] = "renamed"  # create-only: replaced
    impact = compare(StackModel(old), StackModel(new))
    (name,) = [c for c in impact.changes if c.resource == "Name"]
    assert name.action == "modify" and name.cause == "/Value follows Group (replace)"


# --- the rules no defect exercised, shown failing on a template with the edge removed -------------
def _without_edges(model: StackModel, drop: set[str], of: set[str] | None = None) -> StackModel:
    """A copy of the template with every DependsOn on ``drop`` removed (from ``of`` only, if given)."""
    broken = json.loads(json.dumps(model.template))
    for rid, body in broken["Resources"].items():
        if (of is None or rid in of) and "DependsOn" in body:
            body["DependsOn"] = [d for d in body["DependsOn"] if d not in drop]
    return StackModel(broken)


def test_the_egress_rule_fails_when_the_handlers_no_longer_wait_for_their_routes(
    variants: dict[str, StackModel],
) -> None:
    model = variants["default"]
    routes = set(_ids(model, "AWS::EC2::Route", DestinationCidrBlock="0.0.0.0/0"))
    found = rules.kubectl_resources_outlive_egress(_without_edges(model, routes))
    assert found and all(f.missing.startswith("no dependency on PdServingNetworkPrivateSubnet") for f in found)


def test_the_credentials_rule_fails_when_the_controller_no_longer_waits_for_its_association(
    variants: dict[str, StackModel],
) -> None:
    model = variants["internal"]
    (controller,) = _ids(model, "Custom::AWSCDK-EKS-HelmChart", Release="aws-load-balancer-controller")
    (association,) = [
        r.id
        for r in model.of_type("AWS::EKS::PodIdentityAssociation")
        if r.properties["ServiceAccount"] == "aws-load-balancer-controller"
    ]
    (finding,) = rules.aws_controllers_outlive_credentials_and_nodes(
        _without_edges(model, {association}, of={controller})
    )
    assert (finding.resource, finding.missing.split(" (")[0]) == (controller, f"no dependency on {association}")


def test_the_finalizer_rule_fails_when_the_service_no_longer_waits_for_the_controller(
    variants: dict[str, StackModel],
) -> None:
    model = variants["internal"]
    (controller,) = _ids(model, "Custom::AWSCDK-EKS-HelmChart", Release="aws-load-balancer-controller")
    (endpoint,) = [r for r in _ids(model, "Custom::AWSCDK-EKS-KubernetesResource") if "InternalEndpoint" in r]
    (finding,) = rules.finalized_objects_outlive_no_controller(_without_edges(model, {controller}, of={endpoint}))
    assert finding.resource == endpoint and finding.missing.startswith(f"no dependency on {controller}")


def test_the_gcs_store_rule_fails_when_the_ray_service_no_longer_waits_for_the_store_or_the_head(
    variants: dict[str, StackModel],
) -> None:
    model = variants["default"]
    (store,) = _ids(model, "AWS::ElastiCache::ReplicationGroup")
    (association,) = _ids(model, "AWS::EKS::PodIdentityAssociation", ServiceAccount="ray-llm-head")
    (service,) = [r for r in _ids(model, "Custom::AWSCDK-EKS-KubernetesResource") if "RayServiceChart" in r]
    # The manifest names the store's endpoint (a reference) and lists the association: drop both.
    broken = json.loads(json.dumps(model.template))
    body = broken["Resources"][service]
    for resource in broken["Resources"].values():  # the serve rollout's manifest, before it, too
        if resource.get("DependsOn"):
            resource["DependsOn"] = [d for d in resource["DependsOn"] if d != association]
    endpoint = json.dumps({"Fn::GetAtt": [store, "PrimaryEndPoint.Address"]})
    body["Properties"]["Manifest"] = json.loads(json.dumps(body["Properties"]["Manifest"]).replace(endpoint, '"x"'))
    found = rules.ray_clusters_outlive_no_gcs_store(StackModel(broken))
    assert sorted(f.missing.split(" (")[0] for f in found) == sorted(
        [f"no dependency on {store}", f"no dependency on {association}"]
    )


def test_the_gcs_store_rule_has_nothing_to_check_without_fault_tolerance(variants: dict[str, StackModel]) -> None:
    model = variants["gcs_ft_off"]
    assert not _ids(model, "AWS::ElastiCache::ReplicationGroup")
    assert rules.ray_clusters_outlive_no_gcs_store(model) == []


def test_a_capacity_block_group_without_its_scale_down_or_with_a_fixed_time_is_found(
    variants: dict[str, StackModel],
) -> None:
    """The block's decode group as synthesized passes; without its scale-down schedule, or with a
    literal time (which would not follow the block or its extension), the rule names it."""
    rule = "capacity_blocks_scale_to_zero_before_their_end"
    model = variants["capacity_block"]
    assert _found(model, rule) == []
    (decode,) = _ids(model, "AWS::EKS::Nodegroup", CapacityType="CAPACITY_BLOCK")
    template = json.loads(json.dumps(model.template))
    schedules = {k: r for k, r in template["Resources"].items() if r["Type"] == "AWS::Scheduler::Schedule"}
    (scale_down,) = [k for k, r in schedules.items() if "scale-down" in json.dumps(r)]
    fixed = json.loads(json.dumps(template))
    fixed["Resources"][scale_down]["Properties"]["ScheduleExpression"] = "at(2027-01-01T10:30:00)"
    assert [f.missing for f in _found(StackModel(fixed), rule)] == [
        'its time "at(2027-01-01T10:30:00)" is not the capacity check\'s ScaleDownAt'
    ]
    del template["Resources"][scale_down]
    assert [(f.resource, f.missing) for f in _found(StackModel(template), rule)] == [
        (decode, "no scale-down schedule names this Capacity Block group")
    ]


# --- rollouts and reserved capacity (before-rollout-fixes/, commit 3b67cfd) --------------------------


def test_a_waited_job_left_unpruned_is_found_on_the_template_before_the_fix(variants: dict[str, StackModel]) -> None:
    rule = "waited_jobs_are_pruned"
    assert _found(variants["default"], rule) == []
    (finding,) = _found(before("autoscaling", BEFORE_ROLLOUT), rule)
    assert finding.missing.startswith("Job ray-llm-rollout-") and "a rollback would not run it" in finding.missing


def test_a_bounds_change_that_leaves_the_job_alone_is_found_on_the_templates_before_the_fix(
    variants: dict[str, StackModel],
) -> None:
    """Before: decode_max_replicas 2 -> 3 left the rollout Job byte-identical, so nothing ran."""
    rule = rules.UPDATE_RULES["waited_jobs_move_with_what_they_apply"]
    old, new = before("autoscaling", BEFORE_ROLLOUT), before("autoscaling_decode_max_3", BEFORE_ROLLOUT)
    (finding,) = rule(old, new)
    assert "cluster config changed but Job ray-llm-rollout-" in finding.missing
    assert rule(variants["autoscaling"], variants["autoscaling_decode_max_3"]) == []
    assert rule(variants["autoscaling_decode_max_3"], variants["autoscaling"]) == []


def test_a_job_that_keeps_its_name_with_another_spec_is_found(variants: dict[str, StackModel]) -> None:
    """A release that changes the pod template under the same name: the apply meets "field is immutable"."""
    rule = rules.UPDATE_RULES["waited_jobs_move_with_what_they_apply"]
    old = variants["default"]
    changed = json.loads(json.dumps(old.template))
    for resource in changed["Resources"].values():
        if resource["Type"] == "Custom::AWSCDK-EKS-KubernetesResource" and "rollout" in json.dumps(resource):
            text = json.dumps(resource["Properties"]["Manifest"])
            resource["Properties"]["Manifest"] = json.loads(text.replace('\\"cpu\\":\\"50m\\"', '\\"cpu\\":\\"60m\\"'))
    found = rule(old, StackModel(changed))  # the cluster rollout's Job and the serve rollout's
    assert len(found) == 2 and all("keeps its name with another spec" in f.missing for f in found)


@pytest.mark.parametrize("variant", ["odcr", "capacity_block"])
def test_a_reserved_group_that_would_surge_is_found_on_the_template_before_the_fix(
    variants: dict[str, StackModel], variant: str
) -> None:
    rule = "reserved_groups_roll_without_a_surge"
    assert _found(variants[variant], rule) == []
    (finding,) = _found(before(variant, BEFORE_ROLLOUT), rule)
    assert finding.missing == "UpdateStrategy DEFAULT in a reservation: its surge node cannot launch"
    assert _found(variants["default"], rule) == []  # on demand: nothing to hold


def test_a_block_end_function_whose_failures_vanish_is_found_on_the_template_before_the_fix(
    variants: dict[str, StackModel],
) -> None:
    rule = "block_end_failures_are_kept_and_alarmed"
    assert _found(variants["capacity_block"], rule) == []
    missing = sorted(f.missing for f in _found(before("capacity_block", BEFORE_ROLLOUT), rule))
    assert missing == [
        "no alarm on its Errors: a failed scale-down warns nobody",
        "no dead-letter queue for an invocation Scheduler cannot make",
        "no dead-letter queue for an invocation Scheduler cannot make",
        "no on-failure destination: a failed scale-down is dropped",
    ]


def test_a_capacity_check_that_would_refuse_a_rollback_is_found_on_the_template_before_the_fix(
    variants: dict[str, StackModel],
) -> None:
    rule = "checks_never_refuse_a_rollback"
    assert _found(variants["default"], rule) == [] and _found(variants["capacity_block"], rule) == []
    (finding,) = _found(before("autoscaling", BEFORE_ROLLOUT), rule)
    assert finding.missing == "its function cannot read the stack's status: a rollback is refused"


# --- what the failover's review found at run time (before-failover-fixes/, commit 0a5e276) -------


def test_a_rollout_job_name_over_a_label_value_is_found_on_the_template_before_the_fix(
    variants: dict[str, StackModel],
) -> None:
    """A 40-character service name (accepted) gave a 66-character Job name: Kubernetes refuses the
    Job controller's pod label and the deploy fails."""
    rule = "waited_jobs_fit_their_names"
    assert _found(variants["long_name"], rule) == [] and _found(variants["default"], rule) == []
    (finding,) = _found(before("long_name", BEFORE_FAILOVER), rule)
    assert finding.missing.endswith("has 66 characters, over 63")
    (job,) = [name for name in _job_names(variants["long_name"]) if "-rollout-" in name and "-serve-" not in name]
    assert len(job) == 63 and job.startswith("a" * 37 + "-rollout-")
    (serve,) = [name for name in _job_names(variants["long_name"]) if "-serve-rollout-" in name]
    assert len(serve) == 63 and serve.startswith("a" * 31 + "-serve-rollout-")


def test_the_engines_rule_fails_when_the_ray_service_does_not_wait_for_a_staged_revision(
    variants: dict[str, StackModel],
) -> None:
    rule = "engines_start_after_their_weights"
    template = variants["second_model"].template
    (second,) = [name for name, r in template["Resources"].items()
                 if r["Type"] == "Custom::ModelWeights" and r["Properties"]["Model"] == "Qwen/Qwen3-8B"]  # fmt: skip
    assert _found(variants["second_model"], rule) == []
    broken = json.loads(json.dumps(template))
    for resource in broken["Resources"].values():  # the edge gone, directly and through the serve rollout
        if second in (resource.get("DependsOn") or []):
            resource["DependsOn"] = [d for d in resource["DependsOn"] if d != second]
    (finding,) = _found(StackModel(broken), rule)
    assert finding.missing == f"no dependency on {second} (its engines read that revision)"


def _job_names(model: StackModel) -> list[str]:
    return [o.name for r in model.of_type(facts.MANIFEST) for o in facts.kube_objects(r) if o.kind == "Job"]


def test_a_failed_rollout_job_that_stays_is_found_on_the_template_before_the_fix(
    variants: dict[str, StackModel],
) -> None:
    """An upgrade from 8550927 whose rollout failed: the rollback (to a release that did not prune
    the Job) left the failed Job, and the next deploy applied it unchanged and waited 14 minutes."""
    rule = "waited_jobs_leave_after_they_finish"
    assert _found(variants["default"], rule) == []
    (finding,) = _found(before("default", BEFORE_FAILOVER), rule)
    assert "stays once finished (ttlSecondsAfterFinished None)" in finding.missing
