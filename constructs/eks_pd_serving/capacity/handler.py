"""Deploy-time capacity check: a CloudFormation custom resource (aws-cdk-lib's Provider
framework) that fails the deploy, before the EKS cluster is created, when the GPU node groups
could not launch. Its message is the one line the framework shows in the stack events."""

from __future__ import annotations

import datetime
from typing import Any

if __package__:  # imported from the package (tests)
    from . import checks
else:  # in Lambda this folder is the code root
    import checks  # type: ignore[no-redef]


class CapacityCheckFailed(RuntimeError):
    """One line: every failed check with its fix."""


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
    properties: dict[str, Any], ec2: Any, quotas: Any, now: datetime.datetime | None = None
) -> dict[str, Any]:
    """The capacity checks, then each reservation's (as preflight runs them). Returns the checks'
    summary and, for each Capacity Block group, when it scales to zero and when it is warned (the
    schedules' expressions, ``checks.block_attributes``)."""
    now = now or datetime.datetime.now(datetime.UTC)
    gpu_az, cluster = str(properties["GpuAvailabilityZone"]), str(properties["ClusterName"])
    reserved = reservations_from(properties)
    found = checks.check_capacity(ec2, quotas, groups_from(properties), gpu_az, cluster_name=cluster, reserved=reserved)
    reservation_checks, ends = checks.check_reservations(ec2, reserved, gpu_az, cluster_name=cluster, now=now)
    found += reservation_checks
    problem = checks.failures(found)
    if problem:
        raise CapacityCheckFailed(f"GPU capacity check failed: {problem}")
    data: dict[str, Any] = {"Checks": "; ".join(f"{c.name}: {c.detail}" for c in found)[:1000]}
    for group, end in sorted(ends.items()):
        scale_down, warn = checks.block_times(end, now)
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

    data = run_checks(properties, boto3.client("ec2"), boto3.client("service-quotas"))
    return {"PhysicalResourceId": physical_id, "Data": data}
