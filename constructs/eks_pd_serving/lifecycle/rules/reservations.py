"""Rules on GPU capacity bought ahead: a Capacity Block's node group is scaled to zero before EC2
terminates the block's instances, at a time read from the block itself, and every node group in a
reservation rolls without a surge node (a full reservation has none to give), and a failed
scale-down is kept and raises an alarm."""

from __future__ import annotations

import json
from typing import Any

from .. import facts
from ..graph import StackModel, references
from .finding import Finding

NODEGROUP = "AWS::EKS::Nodegroup"
SCHEDULE = "AWS::Scheduler::Schedule"
CAPACITY_CHECK = "Custom::GpuCapacityCheck"
CAPACITY_CHECK_HANDLER = "handler.on_event"
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


def checks_never_refuse_a_rollback(model: StackModel) -> list[Finding]:
    """The deploy-time capacity check runs on a rollback too (CloudFormation's Update with the old
    properties) and must not fail it: its function reads its stack's status, so its role may call
    ``cloudformation:DescribeStacks`` on ``AWS::StackId``."""
    rule = "checks_never_refuse_a_rollback"
    found = []
    for check in model.of_type(CAPACITY_CHECK):
        functions = [
            model.resources[f]
            for f in facts.provider_functions(model, check)
            if model.resources[f].properties.get("Handler") == CAPACITY_CHECK_HANDLER
        ]
        readable = any(_allows(model, f, "cloudformation:DescribeStacks", {"Ref": "AWS::StackId"}) for f in functions)
        if not readable:
            found.append(Finding(rule, check.id, "its function cannot read the stack's status: a rollback is refused"))
    return found


def _allows(model: StackModel, function: Any, action: str, resource: Any) -> bool:
    """Whether a policy on ``function``'s role allows ``action`` on ``resource`` (as the template
    writes it)."""
    role = function.properties.get("Role")
    role_id = role["Fn::GetAtt"][0] if isinstance(role, dict) and "Fn::GetAtt" in role else None
    for policy in model.of_type("AWS::IAM::Policy"):
        if {"Ref": role_id} not in (policy.properties.get("Roles") or []):
            continue
        for statement in (policy.properties.get("PolicyDocument") or {}).get("Statement") or []:
            actions = statement.get("Action")
            resources = statement.get("Resource")
            actions = actions if isinstance(actions, list) else [actions]
            resources = resources if isinstance(resources, list) else [resources]
            if statement.get("Effect") == "Allow" and action in actions and resource in resources:
                return True
    return False


def reserved_groups_roll_without_a_surge(model: StackModel) -> list[Finding]:
    """Each node group that launches into a reservation (``CapacityType: CAPACITY_BLOCK``, or a
    launch template targeting an ODCR or a reservation group) has ``UpdateConfig.UpdateStrategy``
    MINIMAL: EKS's DEFAULT launches the new node before it terminates an old one, and EC2 refuses
    that instance when the reservation is full."""
    rule = "reserved_groups_roll_without_a_surge"
    reserving = {
        r.id
        for r in model.of_type("AWS::EC2::LaunchTemplate")
        if ((r.properties.get("LaunchTemplateData") or {}).get("CapacityReservationSpecification") or {}).get(
            "CapacityReservationTarget"
        )
    }
    found = []
    for group in model.of_type(NODEGROUP):
        template = set(references(group.properties.get("LaunchTemplate") or {}))
        if group.properties.get("CapacityType") != "CAPACITY_BLOCK" and not template & reserving:
            continue
        strategy = (group.properties.get("UpdateConfig") or {}).get("UpdateStrategy", "DEFAULT")
        if strategy != "MINIMAL":
            found.append(
                Finding(rule, group.id, f"UpdateStrategy {strategy} in a reservation: its surge node cannot launch")
            )
    return found


def block_end_failures_are_kept_and_alarmed(model: StackModel) -> list[Finding]:
    """The Capacity Block end function runs asynchronously (Scheduler invokes Lambda with the
    Event type; Lambda retries twice, then drops the event): it has an on-failure destination
    (AWS::Lambda::EventInvokeConfig) and an alarm on its Errors, and each schedule that runs it a
    dead-letter queue for the invocations Scheduler itself cannot make."""
    rule = "block_end_failures_are_kept_and_alarmed"
    found = []
    functions = [r for r in model.of_type("AWS::Lambda::Function") if r.properties.get("Handler") == BLOCK_END_HANDLER]
    for function in functions:
        configs = [
            c
            for c in model.of_type("AWS::Lambda::EventInvokeConfig")
            if function.id in set(references(c.properties.get("FunctionName")))
        ]
        if not any(((c.properties.get("DestinationConfig") or {}).get("OnFailure") or {}).get("Destination")
                   for c in configs):  # fmt: skip
            found.append(Finding(rule, function.id, "no on-failure destination: a failed scale-down is dropped"))
        alarms = [
            a
            for a in model.of_type("AWS::CloudWatch::Alarm")
            if a.properties.get("MetricName") == "Errors"
            and any(function.id in set(references(d.get("Value"))) for d in a.properties.get("Dimensions") or [])
        ]
        if not alarms:
            found.append(Finding(rule, function.id, "no alarm on its Errors: a failed scale-down warns nobody"))
        for schedule in model.of_type(SCHEDULE):
            target = schedule.properties.get("Target") or {}
            if function.id in set(references(target.get("Arn"))) and not (target.get("DeadLetterConfig") or {}).get(
                "Arn"
            ):
                found.append(Finding(rule, schedule.id, "no dead-letter queue for an invocation Scheduler cannot make"))
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
