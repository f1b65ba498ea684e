"""A Capacity Block's end, in the code that runs it: the deploy-time check reads the block and gives
the two schedule times; the scheduled function warns, scales the group to zero, or moves its
schedule when an extension moved the end. Clients are botocore Stubbers (moto knows no Capacity
Blocks, EKS node group configs or Scheduler): each test's stub fails on a call it did not expect."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from typing import Any

import boto3
import pytest
from botocore.stub import ANY, Stubber
from support import NO_AWS_ENV, capacity_properties

from eks_pd_serving.capacity import block_end, checks, handler
from eks_pd_serving.capacity_check import CODE_DIR

CR = "cr-0123456789abcdef0"
NOW = datetime.datetime(2026, 12, 4, 9, 0, tzinfo=datetime.UTC)
END = datetime.datetime(2026, 12, 6, 11, 30, tzinfo=datetime.UTC)  # Capacity Blocks end at 11:30 UTC
TOPIC = "arn:aws:sns:us-east-1:111122223333:alarms"
CLUSTER_NODES = {
    "Filters": [
        {"Name": "instance-state-name", "Values": ["pending", "running"]},
        {"Name": "tag:eks:cluster-name", "Values": ["ray-llm-multinode"]},
    ]
}


def client(service: str) -> tuple[Any, Stubber]:
    made = boto3.client(service, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    return made, Stubber(made)


def block(**overrides: Any) -> dict[str, Any]:
    found = {
        "CapacityReservationId": CR, "InstanceType": "p5.48xlarge", "AvailabilityZone": "us-east-1a",
        "Tenancy": "default", "InstancePlatform": "Linux/UNIX", "State": "active",
        "TotalInstanceCount": 2, "AvailableInstanceCount": 2, "EndDate": END, "ReservationType": "capacity-block",
    }  # fmt: skip
    return {**found, **overrides}


def reservation_properties() -> dict[str, Any]:
    props = capacity_properties(gpu=("p5.48xlarge", 2))
    props["Reservations"] = [
        {"Name": "gpu", "InstanceType": "p5.48xlarge", "MaxNodes": "2", "Kind": "capacity-block", "Target": CR,
         "Setting": "gpu_capacity"},
    ]  # fmt: skip
    return props


# --- the deploy-time check ------------------------------------------------------------------------
def test_the_times_keep_ec2s_termination_and_a_drain_between_them() -> None:
    scale_down, warn = checks.block_times(END, NOW)
    assert END - scale_down == checks.SCALE_DOWN_BEFORE_END == datetime.timedelta(hours=1)
    # EC2 begins terminating the block's instances 30 minutes before its end: the scale-down leaves
    # that much again for the managed node group's update and its drain.
    assert (END - checks.EC2_TERMINATES_BEFORE_END) - scale_down == datetime.timedelta(minutes=30)
    assert END - warn == datetime.timedelta(days=1)
    # A block deployed less than a day before its end: the warning goes out an hour after the check
    # (the schedules are created later in the same deploy), never after the scale-down.
    late = END - datetime.timedelta(hours=3)
    assert checks.block_times(END, late)[1] == late + datetime.timedelta(hours=1)
    # The shortest block the check admits (RESERVATION_MARGIN) still leaves the scale-down that lead.
    shortest = END - checks.RESERVATION_MARGIN
    assert checks.block_times(END, shortest)[0] - shortest >= checks.SCHEDULE_LEAD
    assert checks.schedule_expression(scale_down) == "at(2026-12-06T10:30:00)"


def test_the_deploy_time_check_reads_the_block_and_gives_both_schedule_times(monkeypatch: pytest.MonkeyPatch) -> None:
    ec2, stub = client("ec2")
    monkeypatch.setattr(checks, "check_capacity", lambda *a, **kw: [])
    stub.add_response("describe_capacity_reservations", {"CapacityReservations": [block()]},
                      {"CapacityReservationIds": [CR]})  # fmt: skip
    stub.add_response("describe_instances", {"Reservations": []}, CLUSTER_NODES)
    with stub:
        data = handler.run_checks(reservation_properties(), ec2, None, now=NOW)
    assert data["ScaleDownAtGpu"] == "at(2026-12-06T10:30:00)"
    assert data["WarnAtGpu"] == "at(2026-12-05T11:30:00)"
    assert f"Capacity (gpu): {CR}: p5.48xlarge in us-east-1a, 2 free" in data["Checks"]


@pytest.mark.parametrize(
    ("found", "message"),
    [
        (block(AvailabilityZone="us-east-1c"), "it is in us-east-1c, the GPU AZ is us-east-1a"),
        (block(State="expired", EndDate=NOW - datetime.timedelta(days=1)), "its state is expired"),
        (block(EndDate=NOW + datetime.timedelta(minutes=90)), "within 2:00:00"),
    ],
)
def test_the_deploy_time_check_refuses_a_block_that_does_not_fit_in_one_line(
    found: dict[str, Any], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ec2, stub = client("ec2")
    monkeypatch.setattr(checks, "check_capacity", lambda *a, **kw: [])
    stub.add_response("describe_capacity_reservations", {"CapacityReservations": [found]},
                      {"CapacityReservationIds": [CR]})  # fmt: skip
    stub.add_response("describe_instances", {"Reservations": []}, CLUSTER_NODES)
    with stub, pytest.raises(handler.CapacityCheckFailed, match=message) as raised:
        handler.run_checks(reservation_properties(), ec2, None, now=NOW)
    assert "\n" not in str(raised.value) and "Fix: choose a reservation that matches, or gpu_capacity=on-demand" in str(
        raised.value
    )


# --- the scheduled function -----------------------------------------------------------------------
def event(action: str, topic: str = TOPIC) -> dict[str, Any]:
    return {
        "action": action, "group": "gpu", "reservation": CR, "cluster": "ray-llm-multinode",
        "nodegroup": "GpuNodeGroup-abc", "topic": topic, "schedule": f"ray-llm-multinode-x-gpu-{action}",
        "schedule_group": "default",
    }  # fmt: skip


def clients(end: datetime.datetime = END) -> tuple[dict[str, Any], dict[str, Stubber]]:
    made = {name: client(name) for name in ("ec2", "eks", "sns", "scheduler")}
    made["ec2"][1].add_response(
        "describe_capacity_reservations",
        {"CapacityReservations": [block(EndDate=end)]},
        {"CapacityReservationIds": [CR]},
    )
    return {name: c for name, (c, _) in made.items()}, {name: s for name, (_, s) in made.items()}


def run(action: str, now: datetime.datetime, stubs: dict[str, Stubber], made: dict[str, Any], **kw: Any) -> str:
    for stub in stubs.values():
        stub.activate()
    said = block_end.on_schedule(event(action, **kw), clients=made, now=now)["message"]
    for stub in stubs.values():
        stub.assert_no_pending_responses()
    return said


def test_the_scale_down_sets_the_group_to_zero_and_notifies() -> None:
    made, stubs = clients()
    nodegroup = {"clusterName": "ray-llm-multinode", "nodegroupName": "GpuNodeGroup-abc"}
    stubs["eks"].add_response(
        "describe_nodegroup",
        {"nodegroup": {"scalingConfig": {"minSize": 2, "maxSize": 2, "desiredSize": 2}}},
        nodegroup,
    )
    stubs["eks"].add_response(
        "update_nodegroup_config", {}, {**nodegroup, "scalingConfig": {"minSize": 0, "desiredSize": 0, "maxSize": 2}}
    )
    subject = f"Capacity Block {CR}: gpu scaled to zero"
    stubs["sns"].add_response("publish", {"MessageId": "m"}, {"TopicArn": TOPIC, "Subject": subject, "Message": ANY})
    said = run(block_end.SCALE_DOWN, END - datetime.timedelta(hours=1), stubs, made)
    assert "is scaling to zero (EKS drains each node" in said


def test_the_warning_names_the_time_and_the_fix_and_scales_nothing() -> None:
    made, stubs = clients()
    stubs["sns"].add_response(
        "publish", {"MessageId": "m"}, {"TopicArn": TOPIC, "Subject": f"Capacity Block {CR} ends soon", "Message": ANY}
    )
    said = run(block_end.WARN, END - datetime.timedelta(days=1), stubs, made)
    assert "scales to zero at 2026-12-06T10:30:00+00:00" in said and "purchase-capacity-block-extension" in said


def test_without_a_topic_the_function_only_logs(capsys: pytest.CaptureFixture[str]) -> None:
    made, stubs = clients()
    run(block_end.WARN, END - datetime.timedelta(days=1), stubs, made, topic="")
    assert json.loads(capsys.readouterr().out)["capacity_block"].startswith(f"Capacity Block {CR} ends")


def test_an_extension_moves_the_schedule_instead_of_scaling_down() -> None:
    """The block was extended by a week after the deploy: at the old time the function re-reads the
    end and moves its own schedule; no node group call is made (the eks stub has none)."""
    made, stubs = clients(end=END + datetime.timedelta(days=7))
    name = event(block_end.SCALE_DOWN)["schedule"]
    target = {"Arn": "arn:aws:lambda:us-east-1:111122223333:function:f", "RoleArn": "arn:aws:iam::111122223333:role/r"}
    current = {"Name": name, "GroupName": "default", "FlexibleTimeWindow": {"Mode": "OFF"}, "Target": target,
               "State": "ENABLED", "ScheduleExpression": "at(2026-12-06T10:30:00)"}  # fmt: skip
    stubs["scheduler"].add_response("get_schedule", current, {"Name": name, "GroupName": "default"})
    stubs["scheduler"].add_response(
        "update_schedule",
        {"ScheduleArn": "arn:aws:scheduler:us-east-1:111122223333:schedule/default/x"},
        {"Name": name, "GroupName": "default", "ScheduleExpression": "at(2026-12-13T10:30:00)",
         "ScheduleExpressionTimezone": "UTC", "FlexibleTimeWindow": {"Mode": "OFF"}, "Target": target,
         "State": "ENABLED"},
    )  # fmt: skip
    said = run(block_end.SCALE_DOWN, END - datetime.timedelta(hours=1), stubs, made)
    assert said.endswith("moved to 2026-12-13T10:30:00+00:00")


def test_the_block_end_code_runs_as_lambda_loads_it() -> None:
    """Lambda imports block_end.py as a top-level module from the asset root (checks beside it)."""
    script = (
        f"import json, sys; sys.path.insert(0, {str(CODE_DIR)!r}); import block_end; "
        "print(json.dumps([block_end.schedule_expression.__module__, 'eks_pd_serving' in sys.modules]))"
    )
    result = subprocess.run([sys.executable, "-I", "-c", script], env=NO_AWS_ENV, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == ["checks", False]


# --- verify -------------------------------------------------------------------------------------------
def test_verify_says_when_the_block_group_scales_to_zero_and_fails_after_it() -> None:
    from eks_pd_serving.cli import verify
    from eks_pd_serving.config import DeploymentConfig

    settings = DeploymentConfig.create(
        gpu_capacity=f"capacity-block:{CR}",
        availability_zones="us-east-1a,us-east-1b",
        gpu_availability_zone="us-east-1a",
    )
    ec2, stub = client("ec2")
    for _ in range(2):
        stub.add_response("describe_capacity_reservations", {"CapacityReservations": [block()]},
                          {"CapacityReservationIds": [CR]})  # fmt: skip
    with stub:
        (before,) = verify.check_capacity_blocks(settings, lambda: ec2, now=END - datetime.timedelta(days=1, hours=2))
        (after,) = verify.check_capacity_blocks(settings, lambda: ec2, now=END - datetime.timedelta(minutes=30))
    assert before.passed and before.detail == (
        f"{CR} ends 2026-12-06T11:30:00+00:00; the gpu group scales to zero at 2026-12-06T10:30:00+00:00 "
        "(in 1 d 1 h), warning at 2026-12-05T11:30:00+00:00"
    )
    assert not after.passed and "was scaled to zero at 2026-12-06T10:30:00+00:00. Fix: deploy with gpu_capacity" in (
        after.detail
    )
    assert verify.check_capacity_blocks(DeploymentConfig.create(), lambda: pytest.fail("no block, no call")) == []


def test_a_late_warning_fires_once_and_does_not_move_itself() -> None:
    """Deployed three hours before the end: the warning was timed an hour after the check; when it
    fires, the end is where it was, so it warns (a re-read of its floor would move it forever)."""
    made, stubs = clients()
    stubs["sns"].add_response(
        "publish", {"MessageId": "m"}, {"TopicArn": TOPIC, "Subject": f"Capacity Block {CR} ends soon", "Message": ANY}
    )
    said = run(block_end.WARN, END - datetime.timedelta(hours=2), stubs, made)
    assert said.startswith(f"Capacity Block {CR} ends")
