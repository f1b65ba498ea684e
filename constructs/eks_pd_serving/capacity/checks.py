"""The capacity checks, on boto3 clients passed in (moto and Stubber in the tests).

Standard library only (plus the clients): this module runs unchanged inside the deploy-time
Lambda, where it is imported as a top-level module.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

# Managed node group instances carry this tag; this cluster's own nodes are not "other" usage.
CLUSTER_TAG = "eks:cluster-name"


@dataclass(frozen=True)
class QuotaFamily:
    """An EC2 on-demand vCPU quota and the instance families it counts."""

    name: str
    code: str
    prefixes: tuple[str, ...]


QUOTA_SERVICE = "ec2"
# Service Quotas, in vCPUs: "Running On-Demand G and VT instances" (g4dn, g5, g6, g6e, gr6, vt1, ...)
# and "Running On-Demand P instances" (p4d, p5, p5e, p5en, ...).
QUOTA_FAMILIES = (
    QuotaFamily("G/VT", "L-DB2E81BA", ("g", "vt")),
    QuotaFamily("P", "L-417A185B", ("p",)),
)


def quota_family(instance_type: str) -> QuotaFamily | None:
    family = instance_type.split(".", 1)[0]
    return next((q for q in QUOTA_FAMILIES if family.startswith(q.prefixes)), None)


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


def running_vcpus(ec2: Any, family: QuotaFamily, exclude_cluster: str | None = None) -> int:
    """vCPUs of pending/running on-demand instances ``family``'s quota counts, in the region, except
    the nodes of ``exclude_cluster`` (an update of this stack must not count its own nodes twice)."""
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
                if quota_family(instance["InstanceType"]) == family:
                    counted.append(instance["InstanceType"])
    facts = instance_facts(ec2, counted)
    return sum(facts[instance_type][0] for instance_type in counted)


def quota_vcpus(quotas: Any, family: QuotaFamily) -> float:
    """The account's on-demand vCPU quota for ``family``; the AWS default when none was ever applied."""
    from botocore.exceptions import ClientError

    try:
        quota = quotas.get_service_quota(ServiceCode=QUOTA_SERVICE, QuotaCode=family.code)
    except ClientError:
        quota = quotas.get_aws_default_service_quota(ServiceCode=QUOTA_SERVICE, QuotaCode=family.code)
    return float(quota["Quota"]["Value"])


def check_capacity(
    ec2: Any,
    quotas: Any,
    groups: Sequence[GroupNeed],
    gpu_az: str,
    *,
    cluster_name: str | None = None,
) -> list[Check]:
    """EFA support and the GPU AZ's offering for each group, then each instance family's on-demand
    quota (G/VT, P) less what already runs (outside ``cluster_name``) against its groups' vCPUs."""
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
    for family in QUOTA_FAMILIES:
        members = [g for g in groups if g.instance_type in facts and quota_family(g.instance_type) == family]
        if members:
            checks.append(_quota_check(ec2, quotas, family, members, facts, cluster_name))
    return checks


def _quota_check(
    ec2: Any,
    quotas: Any,
    family: QuotaFamily,
    groups: Sequence[GroupNeed],
    facts: dict[str, tuple[int, bool]],
    cluster_name: str | None,
) -> Check:
    """``family``'s quota less what already runs (outside ``cluster_name``) against its groups' vCPUs."""
    needed = sum(group.node_count * facts[group.instance_type][0] for group in groups)
    quota = quota_vcpus(quotas, family)
    in_use = running_vcpus(ec2, family, exclude_cluster=cluster_name)
    free = quota - in_use
    parts = " + ".join(f"{g.node_count} x {facts[g.instance_type][0]}" for g in groups)
    detail = f"{free:.0f} free ({quota:.0f} quota - {in_use} running), {needed} needed ({parts} vCPUs)"
    if free < needed:
        detail += (
            f". Fix: request a {family.name} quota of at least {in_use + needed} vCPUs ({family.code} in Service "
            f"Quotas) or stop other {family.name} instances"
        )
    return Check(f"{family.name} vCPU quota", free >= needed, detail)


def failures(checks: Iterable[Check]) -> str:
    """The failed checks as one line ('' when all passed)."""
    return "; ".join(f"{check.name}: {check.detail}" for check in checks if not check.passed)
