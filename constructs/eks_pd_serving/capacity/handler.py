"""Deploy-time capacity check: a CloudFormation custom resource (aws-cdk-lib's Provider
framework) that fails the deploy, before the EKS cluster is created, when the GPU node groups
could not launch. Its message is the one line the framework shows in the stack events.

A rollback runs it too: CloudFormation sends an Update with the properties of the state it returns
to, and a check that failed then (quota or a reservation moved since) would leave the stack in
UPDATE_ROLLBACK_FAILED. CloudFormation's request says nothing of a rollback, the stack's status
does (UPDATE_ROLLBACK_IN_PROGRESS while it rolls back), so the handler reads it and reports the
checks without failing on them; the state it returns to is the one that ran before."""

from __future__ import annotations

import datetime
from typing import Any

if __package__:  # imported from the package (tests)
    from . import checks
else:  # in Lambda this folder is the code root
    import checks  # type: ignore[no-redef]


class CapacityCheckFailed(RuntimeError):
    """One line: every failed check with its fix."""


# The stack's status while CloudFormation rolls an update back (its own and a nested stack's).
ROLLING_BACK = "UPDATE_ROLLBACK_IN_PROGRESS"
# A Capacity Block the waived check could not read: its scale-down is put this far out (the block's
# own end still terminates its instances), its warning within SCHEDULE_LEAD.
UNREAD_BLOCK_SCALE_DOWN = datetime.timedelta(days=365)
NOT_ENFORCED = "not enforced, the stack is rolling back to its previous state"


def rolling_back(cloudformation: Any, stack_id: str) -> tuple[bool, str]:
    """Whether the stack is rolling back, and what was read. An unreadable status counts as a
    rollback: a check that cannot tell must not fail a rollback (a skipped check on a forward
    deploy costs an early message; a failed rollback leaves the stack stuck)."""
    try:
        (stack,) = cloudformation.describe_stacks(StackName=stack_id)["Stacks"]
    except Exception as error:  # denied, throttled: say so in the check's data
        return True, f"stack status unreadable ({type(error).__name__}: {str(error)[:200]})"
    status = str(stack["StackStatus"])
    return status == ROLLING_BACK, f"stack {status}"


def groups_from(properties: dict[str, Any]) -> list[checks.GroupNeed]:
    """CloudFormation passes every scalar of a custom resource as a string."""
    return [
        checks.GroupNeed(name=str(g["Name"]), instance_type=str(g["InstanceType"]), node_count=int(g["NodeCount"]))
        for g in properties["Groups"]
    ]


def reservations_from(properties: dict[str, Any]) -> list[checks.ReservedGroup]:
    return [
        checks.ReservedGroup(
            name=str(r["Name"]),
            instance_type=str(r["InstanceType"]),
            max_nodes=int(r["MaxNodes"]),
            kind=str(r["Kind"]),
            target=str(r["Target"]),
            setting=str(r["Setting"]),
        )
        for r in properties.get("Reservations", [])
    ]


def run_checks(
    properties: dict[str, Any], ec2: Any, quotas: Any, now: datetime.datetime | None = None, waived: str = ""
) -> dict[str, Any]:
    """The capacity checks, then each reservation's (as preflight runs them). Returns the checks'
    summary and, for each Capacity Block group, when it scales to zero and when it is warned (the
    schedules' expressions, ``checks.block_attributes``). A failed check raises, unless
    ``waived`` says why not (a rollback): then the summary names the failure."""
    now = now or datetime.datetime.now(datetime.UTC)
    gpu_az, cluster = str(properties["GpuAvailabilityZone"]), str(properties["ClusterName"])
    reserved = reservations_from(properties)
    found = checks.check_capacity(ec2, quotas, groups_from(properties), gpu_az, cluster_name=cluster, reserved=reserved)
    reservation_checks, ends = checks.check_reservations(ec2, reserved, gpu_az, cluster_name=cluster, now=now)
    found += reservation_checks
    problem = checks.failures(found)
    if problem and not waived:
        raise CapacityCheckFailed(f"GPU capacity check failed: {problem}")
    summary = "; ".join(f"{c.name}: {c.detail}" for c in found)
    if problem:
        print(f"GPU capacity check failed, {waived}: {problem}", flush=True)
        summary = f"{NOT_ENFORCED} ({waived}): {problem}"
    data: dict[str, Any] = {"Checks": summary[:1000]}
    # Every block group's two times, whether or not a check failed: its schedules GetAtt them, and a
    # missing attribute fails the update, or the rollback, that waived the check.
    for group in sorted({r.name for r in reserved if r.block}):
        end = ends.get(group)
        if end is None:  # unread (only while waived): warn within the hour, never scale down blind
            scale_down, warn = now + UNREAD_BLOCK_SCALE_DOWN, now + checks.SCHEDULE_LEAD
        else:  # a block that ended or ends too soon (waived): its schedules still lie ahead
            scale_down, warn = checks.block_times(end, now)
            scale_down = max(scale_down, now + checks.SCHEDULE_LEAD)
            warn = min(max(warn, now + checks.SCHEDULE_LEAD), scale_down)
        scale_attribute, warn_attribute = checks.block_attributes(group)
        data[scale_attribute] = checks.schedule_expression(scale_down)
        data[warn_attribute] = checks.schedule_expression(warn)
    return data


def on_event(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    properties = event["ResourceProperties"]
    physical_id = f"gpu-capacity-{properties['ClusterName']}"
    if event["RequestType"] == "Delete":
        return {"PhysicalResourceId": event.get("PhysicalResourceId", physical_id)}
    import boto3

    skip = ""
    if event["RequestType"] == "Update":
        back, status = rolling_back(boto3.client("cloudformation"), str(event["StackId"]))
        skip = status if back else ""
    data = run_checks(properties, boto3.client("ec2"), boto3.client("service-quotas"), waived=skip)
    return {"PhysicalResourceId": physical_id, "Data": data}
