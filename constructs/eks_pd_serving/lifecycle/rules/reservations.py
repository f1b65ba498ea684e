"""Rules on GPU capacity bought for a time: a Capacity Block's node group is scaled to zero before
EC2 terminates the block's instances, at a time read from the block itself."""

from __future__ import annotations

import json
from typing import Any

from ..graph import StackModel
from .finding import Finding

NODEGROUP = "AWS::EKS::Nodegroup"
SCHEDULE = "AWS::Scheduler::Schedule"
CAPACITY_CHECK = "Custom::GpuCapacityCheck"
BLOCK_END_HANDLER = "block_end.on_schedule"


def capacity_blocks_scale_to_zero_before_their_end(model: StackModel) -> list[Finding]:
    """Each node group with ``CapacityType: CAPACITY_BLOCK`` has a scale-down schedule and a warning
    schedule naming it, each timed by the capacity check's attribute (read from the block at
    deploy: a literal time would not follow the block) and running the block-end function."""
    rule = "capacity_blocks_scale_to_zero_before_their_end"
    found: list[Finding] = []
    functions = {
        r.id for r in model.of_type("AWS::Lambda::Function") if r.properties.get("Handler") == BLOCK_END_HANDLER
    }
    checks = {r.id for r in model.of_type(CAPACITY_CHECK)}
    schedules = [(r, _event(r.properties)) for r in model.of_type(SCHEDULE)]
    for group in model.of_type(NODEGROUP):
        if group.properties.get("CapacityType") != "CAPACITY_BLOCK":
            continue
        for action, attribute in (("scale-down", "ScaleDownAt"), ("warn", "WarnAt")):
            mine = [s for s, event in schedules if event.get("action") == action and group.id in event["nodegroup"]]
            if not mine:
                found.append(Finding(rule, group.id, f"no {action} schedule names this Capacity Block group"))
                continue
            for schedule in mine:
                timed = schedule.properties.get("ScheduleExpression")
                getatt = timed.get("Fn::GetAtt") if isinstance(timed, dict) else None
                if not getatt or getatt[0] not in checks or not str(getatt[1]).startswith(attribute):
                    found.append(
                        Finding(
                            rule, schedule.id, f"its time {json.dumps(timed)} is not the capacity check's {attribute}"
                        )
                    )
                target = (schedule.properties.get("Target") or {}).get("Arn")
                getatt = target.get("Fn::GetAtt") if isinstance(target, dict) else None
                if not getatt or getatt[0] not in functions:
                    found.append(Finding(rule, schedule.id, "its target is not the Capacity Block end function"))
    return found


def _event(properties: Any) -> dict[str, Any]:
    """The schedule's input with its tokens as text (``nodegroup``: the references it names)."""
    raw = (properties.get("Target") or {}).get("Input")
    parts = raw["Fn::Join"][1] if isinstance(raw, dict) and "Fn::Join" in raw else [raw or "{}"]
    text = "".join(p if isinstance(p, str) else json.dumps(p).replace('"', "'") for p in parts)
    try:
        event = json.loads(text)
    except json.JSONDecodeError:
        return {"nodegroup": ""}
    return {**event, "nodegroup": str(event.get("nodegroup", ""))}
