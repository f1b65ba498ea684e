"""A Capacity Block's end, run by two one-time EventBridge Scheduler schedules per block group: the
warning a day ahead (to the alarms' SNS topic, when there is one) and the scale-down to zero an
hour before the end, while EC2 has not begun terminating the block's instances. Each run reads the
block's end again first: when an extension moved it, the schedule is moved instead.

Standard library only (plus the clients): runs unchanged in its Lambda, where this folder is the
code root, as ``checks`` does.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

if __package__:  # imported from the package (tests)
    from .checks import SCALE_DOWN_BEFORE_END, WARN_BEFORE_END, schedule_expression
else:  # in Lambda this folder is the code root
    from checks import SCALE_DOWN_BEFORE_END, WARN_BEFORE_END, schedule_expression  # type: ignore[no-redef]

# A schedule that fires more than this before its (re-read) time was moved by an extension.
MOVED = datetime.timedelta(minutes=10)
SCALE_DOWN, WARN = "scale-down", "warn"


def on_schedule(
    event: dict[str, Any],
    context: Any = None,
    *,
    clients: dict[str, Any] | None = None,
    now: datetime.datetime | None = None,
) -> dict[str, str]:
    """``event``: the schedule's input: action (scale-down or warn), group, reservation, cluster,
    nodegroup, topic ('' for none), schedule and schedule_group (the schedule's own name, to move it)."""
    import boto3

    clients = clients or {name: boto3.client(name) for name in ("ec2", "eks", "sns", "scheduler")}
    now = now or datetime.datetime.now(datetime.UTC)
    rid, group, action = event["reservation"], event["group"], event["action"]
    (found,) = clients["ec2"].describe_capacity_reservations(CapacityReservationIds=[rid])["CapacityReservations"]
    end = found["EndDate"]
    scale_down = end - SCALE_DOWN_BEFORE_END
    # Its time as the block's end sets it (not the deploy's floor for a late warning, which
    # block_times applies and which is always ahead of now).
    due = scale_down if action == SCALE_DOWN else end - WARN_BEFORE_END
    if due - now > MOVED:
        _move(clients["scheduler"], event["schedule"], event["schedule_group"], due)
        return _said(f"{rid} now ends {end.isoformat()}: the {action} of {group} moved to {due.isoformat()}")
    if action == WARN:
        message = (
            f"Capacity Block {rid} ends {end.isoformat()}. The {group} GPU node group of {event['cluster']} scales to "
            f"zero at {scale_down.isoformat()}; from then until a deploy brings nodes back, the other engine serves "
            "every request whole at its own capacity (pd_failover; with pd_failover=false they wait in Serve's "
            "queue until the client gives up). Fix: buy an extension "
            "(aws ec2 purchase-capacity-block-extension), or deploy with its capacity setting on another option."
        )
        _publish(clients["sns"], event.get("topic", ""), f"Capacity Block {rid} ends soon", message)
        return _said(message)
    eks = clients["eks"]
    scaling = eks.describe_nodegroup(clusterName=event["cluster"], nodegroupName=event["nodegroup"])["nodegroup"][
        "scalingConfig"
    ]
    eks.update_nodegroup_config(
        clusterName=event["cluster"],
        nodegroupName=event["nodegroup"],
        scalingConfig={"minSize": 0, "desiredSize": 0, "maxSize": max(1, int(scaling["maxSize"]))},
    )
    message = (
        f"Capacity Block {rid} ends {end.isoformat()}: the {group} GPU node group of {event['cluster']} is scaling "
        "to zero (EKS drains each node; requests in flight there end). Deploy with its capacity setting on "
        "another option to bring the phase back."
    )
    _publish(clients["sns"], event.get("topic", ""), f"Capacity Block {rid}: {group} scaled to zero", message)
    return _said(message)


def _move(scheduler: Any, name: str, group: str, due: datetime.datetime) -> None:
    """Re-time a one-time schedule, keeping its target (UpdateSchedule replaces the whole definition)."""
    current = scheduler.get_schedule(Name=name, GroupName=group)
    scheduler.update_schedule(
        Name=name,
        GroupName=group,
        ScheduleExpression=schedule_expression(due),
        ScheduleExpressionTimezone="UTC",
        FlexibleTimeWindow=current["FlexibleTimeWindow"],
        Target=current["Target"],
        State=current.get("State", "ENABLED"),
        **({"Description": current["Description"]} if current.get("Description") else {}),
    )


def _publish(sns: Any, topic: str, subject: str, message: str) -> None:
    if topic:
        sns.publish(TopicArn=topic, Subject=subject[:100], Message=message)


def _said(message: str) -> dict[str, str]:
    print(json.dumps({"capacity_block": message}))
    return {"message": message}
