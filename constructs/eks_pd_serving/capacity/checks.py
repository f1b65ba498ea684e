"""The capacity checks, on boto3 clients passed in (moto and Stubber in the tests).

Standard library only (plus the clients): this module runs unchanged inside the deploy-time
Lambda, where it is imported as a top-level module.
"""

from __future__ import annotations

import datetime
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
    reserved: Sequence[ReservedGroup] = (),
) -> list[Check]:
    """EFA support and the GPU AZ's offering for each group, then each instance family's on-demand
    quota (G/VT, P) less what already runs (outside ``cluster_name``) against its groups' vCPUs.

    A group in ``reserved`` with a named reservation (an ODCR or a Capacity Block, which
    ``check_reservations`` holds to the group's most nodes) is left out of the quota: its nodes
    take capacity the reservation already holds. EC2's guide says an active, unused ODCR counts
    toward the On-Demand limits when it is made; for a Capacity Block it says nothing either way
    (docs/features/capacity.md). A group drawing from a reservation group (an ARN) still counts:
    its reservations are not read."""
    in_reservation = {group.name for group in reserved if group.reservation_id}
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
        counted = [g for g in members if g.name not in in_reservation]
        held = ", ".join(g.name for g in members if g.name in in_reservation)
        if counted:
            checks.append(_quota_check(ec2, quotas, family, counted, facts, cluster_name, held))
        elif held:
            checks.append(Check(f"{family.name} vCPU quota", True, f"not counted: {held} launch into a reservation"))
    return checks


def _quota_check(
    ec2: Any,
    quotas: Any,
    family: QuotaFamily,
    groups: Sequence[GroupNeed],
    facts: dict[str, tuple[int, bool]],
    cluster_name: str | None,
    held: str = "",
) -> Check:
    """``family``'s quota less what already runs (outside ``cluster_name``) against its groups' vCPUs
    (``held``: the family's groups left out because they launch into a reservation)."""
    needed = sum(group.node_count * facts[group.instance_type][0] for group in groups)
    quota = quota_vcpus(quotas, family)
    in_use = running_vcpus(ec2, family, exclude_cluster=cluster_name)
    free = quota - in_use
    parts = " + ".join(f"{g.node_count} x {facts[g.instance_type][0]}" for g in groups)
    detail = f"{free:.0f} free ({quota:.0f} quota - {in_use} running), {needed} needed ({parts} vCPUs)"
    if held:
        detail += f"; {held} launch into a reservation, not counted"
    if free < needed:
        detail += (
            f". Fix: request a {family.name} quota of at least {in_use + needed} vCPUs ({family.code} in Service "
            f"Quotas) or stop other {family.name} instances"
        )
    return Check(f"{family.name} vCPU quota", free >= needed, detail)


def failures(checks: Iterable[Check]) -> str:
    """The failed checks as one line ('' when all passed)."""
    return "; ".join(f"{check.name}: {check.detail}" for check in checks if not check.passed)


# --- reservations: On-Demand Capacity Reservations and Capacity Blocks ---------------------------
# A reservation must outlast the deploy and the first hours of serving.
RESERVATION_MARGIN = datetime.timedelta(hours=2)
# EC2 begins terminating a Capacity Block's instances 30 minutes before its end (its expiration
# warning, 40 minutes before, says "in 10 minutes": EC2 user guide, "Monitor Capacity Blocks using
# EventBridge"). The group is scaled to zero 30 minutes before that: EKS drains each node on
# scale-in (the Serve replicas stop, requests in flight end), which the managed node group's
# update and the drain must finish before EC2 starts terminating.
EC2_TERMINATES_BEFORE_END = datetime.timedelta(minutes=30)
DRAIN_BUDGET = datetime.timedelta(minutes=30)
SCALE_DOWN_BEFORE_END = EC2_TERMINATES_BEFORE_END + DRAIN_BUDGET
# A day's notice: time to buy an extension (PurchaseCapacityBlockExtension) or move the phase.
WARN_BEFORE_END = datetime.timedelta(hours=24)
# The soonest a schedule may be timed after the check that reads the block: the schedules are
# created later in the same deploy (after the node groups, about half an hour), and a one-time
# schedule must be created before its time. RESERVATION_MARGIN keeps the scale-down past it too.
SCHEDULE_LEAD = datetime.timedelta(hours=1)


@dataclass(frozen=True)
class ReservedGroup:
    """A GPU node group bought from a reservation: its name, instance type, most nodes, the
    reservation (``kind``: odcr, odcr-group or capacity-block; ``target``: its id or group ARN) and
    the setting that chose it (for the fix)."""

    name: str
    instance_type: str
    max_nodes: int
    kind: str
    target: str
    setting: str

    @property
    def reservation_id(self) -> str | None:
        return self.target if self.kind in ("odcr", "capacity-block") else None

    @property
    def block(self) -> bool:
        """A Capacity Block: it ends on a date, and its group is scaled to zero before then."""
        return self.kind == "capacity-block"


def block_times(end: datetime.datetime, now: datetime.datetime) -> tuple[datetime.datetime, datetime.datetime]:
    """(when the group scales to zero, when the warning goes out) for a block ending at ``end``:
    ``SCALE_DOWN_BEFORE_END`` and ``WARN_BEFORE_END`` before it; a warning already due goes out
    ``SCHEDULE_LEAD`` from ``now`` (the check's run), never after the scale-down."""
    scale_down = end - SCALE_DOWN_BEFORE_END
    warn = max(end - WARN_BEFORE_END, now + SCHEDULE_LEAD)
    return scale_down, min(warn, scale_down)


def block_attributes(group: str) -> tuple[str, str]:
    """The deploy-time check's attributes holding a Capacity Block group's two schedule expressions."""
    title = group[:1].upper() + group[1:]
    return f"ScaleDownAt{title}", f"WarnAt{title}"


def schedule_expression(at: datetime.datetime) -> str:
    """EventBridge Scheduler's one-time expression, in UTC (the schedules say so)."""
    return f"at({at.astimezone(datetime.UTC).strftime('%Y-%m-%dT%H:%M:%S')})"


def check_reservations(
    ec2: Any,
    groups: Sequence[ReservedGroup],
    gpu_az: str,
    *,
    cluster_name: str | None = None,
    now: datetime.datetime | None = None,
) -> tuple[list[Check], dict[str, datetime.datetime]]:
    """Each reserved group's reservation (DescribeCapacityReservations) against the group: its
    instance type, the GPU AZ, default tenancy, Linux/UNIX, state, free instances for the group's
    most nodes (summed where groups share one; the instances ``cluster_name``'s own nodes already
    hold in it count as free, so an update does not refuse the nodes it runs on), and its end (a
    Capacity Block's, or a dated ODCR's) at least ``RESERVATION_MARGIN`` away. One check per group,
    each failure with its fix; and each Capacity Block group's end, wherever the block was read
    (a failed check included)."""
    from botocore.exceptions import ClientError

    now = now or datetime.datetime.now(datetime.UTC)
    wanted: dict[str, int] = {}
    for group in groups:
        if group.reservation_id:
            wanted[group.reservation_id] = wanted.get(group.reservation_id, 0) + group.max_nodes
    checks: list[Check] = []
    ends: dict[str, datetime.datetime] = {}
    for group in groups:
        name = f"Capacity ({group.name})"
        rid = group.reservation_id
        if rid is None:
            checks.append(Check(name, True, f"{group.target}: a reservation group; its reservations are not read here"))
            continue
        try:
            (found,) = ec2.describe_capacity_reservations(CapacityReservationIds=[rid])["CapacityReservations"]
        except ClientError as error:
            code = error.response["Error"]["Code"]
            checks.append(Check(name, False, f"{rid}: {code}. Fix: name a reservation of this account and region"))
            continue
        own = _own_instances(ec2, cluster_name, rid) if cluster_name else 0
        problems = _reservation_problems(found, group, gpu_az, wanted[rid], own, now)
        end = found.get("EndDate")
        if group.block and end is not None:  # read even when it fails: a rollback times its schedules by it
            ends[group.name] = end
        if problems:
            detail = (
                f"{rid}: {'; '.join(problems)}. Fix: choose a reservation that matches, or {group.setting}=on-demand"
            )
            checks.append(Check(name, False, detail))
            continue
        until = f", until {end.isoformat()}" if end is not None else ""
        available = int(found.get("AvailableInstanceCount", 0))
        checks.append(Check(name, True, f"{rid}: {found['InstanceType']} in {gpu_az}, {available} free{until}"))
    return checks, ends


def _own_instances(ec2: Any, cluster_name: str, reservation_id: str) -> int:
    """Pending or running nodes of ``cluster_name`` in the reservation."""
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[
            {"Name": "instance-state-name", "Values": ["pending", "running"]},
            {"Name": f"tag:{CLUSTER_TAG}", "Values": [cluster_name]},
        ]
    )
    return sum(
        1
        for page in pages
        for reservation in page["Reservations"]
        for instance in reservation["Instances"]
        if instance.get("CapacityReservationId") == reservation_id
    )


def _reservation_problems(
    found: dict[str, Any], group: ReservedGroup, gpu_az: str, wanted: int, own: int, now: datetime.datetime
) -> list[str]:
    problems = []
    if found["InstanceType"] != group.instance_type:
        problems.append(f"it reserves {found['InstanceType']}, the group runs {group.instance_type}")
    if found["AvailabilityZone"] != gpu_az:
        problems.append(f"it is in {found['AvailabilityZone']}, the GPU AZ is {gpu_az} (set gpu_availability_zone)")
    if found.get("Tenancy", "default") != "default":
        problems.append(f"its tenancy is {found['Tenancy']}, the nodes launch with default tenancy")
    if found.get("InstancePlatform", "Linux/UNIX") != "Linux/UNIX":
        problems.append(f"its platform is {found['InstancePlatform']}, the nodes run Linux/UNIX")
    state = found.get("State")
    if state == "scheduled":
        problems.append(f"it starts at {found.get('StartDate')}: deploy after that")
    elif state != "active":
        problems.append(f"its state is {state}")
    available = int(found.get("AvailableInstanceCount", 0)) + own
    if available < wanted:
        problems.append(f"{available} instance(s) free, the groups on it need {wanted}")
    end = found.get("EndDate")
    if end is not None and end - now < RESERVATION_MARGIN:
        problems.append(f"it ends at {end.isoformat()}, within {RESERVATION_MARGIN} (nodes are terminated then)")
    return problems
