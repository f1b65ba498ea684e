"""Deploy-time capacity check: a CloudFormation custom resource (aws-cdk-lib's Provider
framework) that fails the deploy, before the EKS cluster is created, when the GPU node groups
could not launch. Its message is the one line the framework shows in the stack events."""

from __future__ import annotations

from typing import Any

if __package__:  # imported from the package (tests)
    from .checks import GroupNeed, check_capacity, failures
else:  # in Lambda this folder is the code root
    from checks import GroupNeed, check_capacity, failures  # type: ignore[no-redef]


class CapacityCheckFailed(RuntimeError):
    """One line: every failed check with its fix."""


def groups_from(properties: dict[str, Any]) -> list[GroupNeed]:
    """CloudFormation passes every scalar of a custom resource as a string."""
    return [
        GroupNeed(name=str(g["Name"]), instance_type=str(g["InstanceType"]), node_count=int(g["NodeCount"]))
        for g in properties["Groups"]
    ]


def run_checks(properties: dict[str, Any], ec2: Any, quotas: Any) -> dict[str, Any]:
    checks = check_capacity(
        ec2,
        quotas,
        groups_from(properties),
        str(properties["GpuAvailabilityZone"]),
        cluster_name=str(properties["ClusterName"]),
    )
    problem = failures(checks)
    if problem:
        raise CapacityCheckFailed(f"GPU capacity check failed: {problem}")
    return {"Checks": "; ".join(f"{c.name}: {c.detail}" for c in checks)[:1000]}


def on_event(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    properties = event["ResourceProperties"]
    physical_id = f"gpu-capacity-{properties['ClusterName']}"
    if event["RequestType"] == "Delete":
        return {"PhysicalResourceId": event.get("PhysicalResourceId", physical_id)}
    import boto3

    data = run_checks(properties, boto3.client("ec2"), boto3.client("service-quotas"))
    return {"PhysicalResourceId": physical_id, "Data": data}
