"""The capacity checks, on boto3 clients passed in (moto and Stubber in the tests).

Standard library only (plus the clients): this module runs unchanged inside the deploy-time
Lambda, where it is imported as a top-level module.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

# Service Quotas: "Running On-Demand G and VT instances", counted in vCPUs.
G_VT_QUOTA_SERVICE = "ec2"
G_VT_QUOTA_CODE = "L-DB2E81BA"
# Instance families the G/VT quota counts (g4dn, g5, g6, g6e, gr6, vt1, ...).
_G_VT_PREFIXES = ("g", "vt")
# Managed node group instances carry this tag; this cluster's own nodes are not "other" usage.
CLUSTER_TAG = "eks:cluster-name"


@dataclass(frozen=True)
class GroupNeed:
    """One GPU node group: its name (for messages), instance type and node count."""

    name: str
    instance_type: str
    node_count: int


@dataclass(frozen=True)
class Check:
    """One check's outcome; ``detail`` ends with the fix when it failed."""

    name: str
    passed: bool
    detail: str


def counts_against_g_vt_quota(instance_type: str) -> bool:
    return instance_type.split(".", 1)[0].startswith(_G_VT_PREFIXES)


def instance_facts(ec2: Any, instance_types: Iterable[str]) -> dict[str, tuple[int, bool]]:
    """``{type: (default vCPUs, EFA supported)}`` from DescribeInstanceTypes."""
    wanted = sorted(set(instance_types))
    if not wanted:
        return {}
    facts = {}
    for page in ec2.get_paginator("describe_instance_types").paginate(InstanceTypes=wanted):
        for info in page["InstanceTypes"]:
            facts[info["InstanceType"]] = (
                int(info["VCpuInfo"]["DefaultVCpus"]),
                bool(info["NetworkInfo"].get("EfaSupported")),
            )
    return facts


def offered_azs(ec2: Any, instance_type: str) -> list[str]:
    """AZs of the client's region that offer ``instance_type``, sorted."""
    pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
        LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": [instance_type]}]
    )
    return sorted({offer["Location"] for page in pages for offer in page["InstanceTypeOfferings"]})


def running_g_vt_vcpus(ec2: Any, exclude_cluster: str | None = None) -> int:
    """vCPUs of pending/running on-demand G and VT instances in the region, except the nodes of
    ``exclude_cluster`` (an update of this stack must not count its own nodes twice)."""
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}]
    )
    counted: list[str] = []
    for page in pages:
        for reservation in page["Reservations"]:
            for instance in reservation["Instances"]:
                tags = {tag["Key"]: tag["Value"] for tag in instance.get("Tags", [])}
                if instance.get("InstanceLifecycle") == "spot":  # spot has its own quota
                    continue
                if exclude_cluster is not None and tags.get(CLUSTER_TAG) == exclude_cluster:
                    continue
                if counts_against_g_vt_quota(instance["InstanceType"]):
                    counted.append(instance["InstanceType"])
    facts = instance_facts(ec2, counted)
    return sum(facts[instance_type][0] for instance_type in counted)


def g_vt_quota(quotas: Any) -> float:
    """The account's G/VT on-demand vCPU quota; the AWS default when none was ever applied."""
    from botocore.exceptions import ClientError

    try:
        quota = quotas.get_service_quota(ServiceCode=G_VT_QUOTA_SERVICE, QuotaCode=G_VT_QUOTA_CODE)
    except ClientError:
        quota = quotas.get_aws_default_service_quota(ServiceCode=G_VT_QUOTA_SERVICE, QuotaCode=G_VT_QUOTA_CODE)
    return float(quota["Quota"]["Value"])


def check_capacity(
    ec2: Any,
    quotas: Any,
    groups: Sequence[GroupNeed],
    gpu_az: str,
    *,
    cluster_name: str | None = None,
) -> list[Check]:
    """EFA support and the GPU AZ's offering for each group, then the G/VT quota less what
    already runs (outside ``cluster_name``) against every group's vCPUs together."""
    checks: list[Check] = []
    facts = instance_facts(ec2, (group.instance_type for group in groups))
    for instance_type in sorted(facts):
        efa = facts[instance_type][1]
        fix = "" if efa else ". Fix: choose a GPU instance type with EFA"
        checks.append(Check(f"EFA support ({instance_type})", efa, f"{instance_type} EfaSupported={efa}{fix}"))
    for instance_type in sorted({group.instance_type for group in groups}):
        zones = offered_azs(ec2, instance_type)
        setting = ", ".join(group.name for group in groups if group.instance_type == instance_type)
        if gpu_az in zones:
            checks.append(Check(f"GPU AZ ({instance_type})", True, f"{gpu_az} offers {instance_type}"))
        else:
            where = ", ".join(zones) if zones else "no AZ of this region"
            checks.append(
                Check(
                    f"GPU AZ ({instance_type})",
                    False,
                    f"{gpu_az} does not offer {instance_type} ({setting}); offered in {where}. Fix: run "
                    "`python -m eks_pd_serving preflight` (it pins an AZ that does), or set "
                    "gpu_availability_zone and availability_zones",
                )
            )
    needed = sum(group.node_count * facts[group.instance_type][0] for group in groups if group.instance_type in facts)
    quota = g_vt_quota(quotas)
    in_use = running_g_vt_vcpus(ec2, exclude_cluster=cluster_name)
    free = quota - in_use
    parts = " + ".join(f"{g.node_count} x {facts[g.instance_type][0]}" for g in groups if g.instance_type in facts)
    detail = f"{free:.0f} free ({quota:.0f} quota - {in_use} running), {needed} needed ({parts} vCPUs)"
    if free < needed:
        detail += (
            f". Fix: request a G/VT quota of at least {in_use + needed} vCPUs ({G_VT_QUOTA_CODE} in Service "
            "Quotas) or stop other G/VT instances"
        )
    checks.append(Check("G/VT vCPU quota", free >= needed, detail))
    return checks


def failures(checks: Iterable[Check]) -> str:
    """The failed checks as one line ('' when all passed)."""
    return "; ".join(f"{check.name}: {check.detail}" for check in checks if not check.passed)
