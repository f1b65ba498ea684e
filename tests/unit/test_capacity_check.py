"""The deploy-time GPU capacity check (the Lambda's own code) against moto's EC2 (real offering
and instance-type data) and botocore's Stubber for Service Quotas, which moto does not know."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws
from support import NO_AWS_ENV
from support import capacity_properties as properties
from support import stubbed_quotas as quotas

from eks_pd_serving.capacity import checks, handler
from eks_pd_serving.capacity_check import CODE_DIR

REGION = "us-east-1"


@pytest.fixture
def ec2(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for key, value in {"AWS_ACCESS_KEY_ID": "t", "AWS_SECRET_ACCESS_KEY": "t", "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(key, value)
    with mock_aws():
        yield boto3.client("ec2", region_name=REGION)


def launch(ec2: Any, instance_type: str, count: int, cluster: str | None = None) -> None:
    tags = [{"ResourceType": "instance", "Tags": [{"Key": checks.CLUSTER_TAG, "Value": cluster}]}] if cluster else []
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    ec2.run_instances(ImageId=image, InstanceType=instance_type, MinCount=count, MaxCount=count, TagSpecifications=tags)


def test_passes_when_the_az_offers_the_type_and_the_quota_is_free(ec2: Any) -> None:
    data = handler.run_checks(properties(), ec2, quotas(64))
    assert "G/VT vCPU quota: 64 free (64 quota - 0 running), 64 needed (2 x 32 vCPUs)" in data["Checks"]


def test_fails_when_the_gpu_az_does_not_offer_the_type(ec2: Any) -> None:
    with pytest.raises(handler.CapacityCheckFailed) as failed:
        handler.run_checks(properties(az="us-east-1e"), ec2, quotas(64))
    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith("GPU capacity check failed: GPU AZ (g6.8xlarge): us-east-1e does not offer g6.8xlarge")
    assert "offered in us-east-1a, us-east-1b, us-east-1c, us-east-1d, us-east-1f" in message
    assert "Fix: run `python -m eks_pd_serving preflight`" in message


def test_fails_when_the_type_lacks_efa(ec2: Any) -> None:
    with pytest.raises(handler.CapacityCheckFailed, match=r"g4dn.xlarge EfaSupported=False. Fix: choose a GPU"):
        handler.run_checks(properties(gpu=("g4dn.xlarge", 1)), ec2, quotas(64))


def test_subtracts_other_running_g_instances_but_not_this_clusters_own(ec2: Any) -> None:
    launch(ec2, "g6.8xlarge", 1)  # another workload: 32 vCPUs
    launch(ec2, "g6.8xlarge", 2, cluster="ray-llm-multinode")  # this stack's nodes on an update
    launch(ec2, "m7i.xlarge", 1)  # not a G/VT instance
    data = handler.run_checks(properties(), ec2, quotas(96))
    assert "96 free" not in data["Checks"] and "64 free (96 quota - 32 running), 64 needed" in data["Checks"]
    with pytest.raises(handler.CapacityCheckFailed) as failed:
        handler.run_checks(properties(), ec2, quotas(90))
    assert "G/VT vCPU quota: 58 free (90 quota - 32 running), 64 needed (2 x 32 vCPUs)" in str(failed.value)
    assert "Fix: request a G/VT quota of at least 96 vCPUs (L-DB2E81BA in Service Quotas)" in str(failed.value)


def test_sums_every_group_of_the_per_phase_layout(ec2: Any) -> None:
    props = properties(prefill=("g6.8xlarge", 2), decode=("g6e.8xlarge", 1))
    with pytest.raises(handler.CapacityCheckFailed, match=r"64 free \(64 quota - 0 running\), 96 needed"):
        handler.run_checks(props, ec2, quotas(64))


def test_p_instances_count_against_their_own_quota(ec2: Any) -> None:
    """p5 counts against "Running On-Demand P instances" (L-417A185B), not G/VT: each family's
    groups are held to their own quota, and a running P instance elsewhere is subtracted from it."""
    launch(ec2, "p4d.24xlarge", 1)  # another workload: 96 P vCPUs
    props = properties(prefill=("p5.48xlarge", 1), decode=("g6e.8xlarge", 1))
    data = handler.run_checks(props, ec2, quotas(32, p_value=288))
    assert "G/VT vCPU quota: 32 free (32 quota - 0 running), 32 needed (1 x 32 vCPUs)" in data["Checks"]
    assert "P vCPU quota: 192 free (288 quota - 96 running), 192 needed (1 x 192 vCPUs)" in data["Checks"]
    with pytest.raises(handler.CapacityCheckFailed) as failed:
        handler.run_checks(props, ec2, quotas(32, p_value=192))
    assert "P vCPU quota: 96 free (192 quota - 96 running), 192 needed" in str(failed.value)
    assert "Fix: request a P quota of at least 288 vCPUs (L-417A185B in Service Quotas)" in str(failed.value)


def test_falls_back_to_the_default_quota_when_none_was_applied(ec2: Any) -> None:
    assert "64 free (64 quota" in handler.run_checks(properties(), ec2, quotas(64, applied=False))["Checks"]


def test_create_goes_through_on_event_and_delete_calls_nothing(ec2: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    stubbed = quotas(64)
    real_client = boto3.client
    monkeypatch.setattr(boto3, "client", lambda name, **kw: stubbed if name == "service-quotas" else real_client(name))
    created = handler.on_event({"RequestType": "Create", "ResourceProperties": properties()})
    assert created["PhysicalResourceId"] == "gpu-capacity-ray-llm-multinode"
    monkeypatch.setattr(boto3, "client", lambda *a, **kw: pytest.fail("Delete must not call AWS"))
    deleted = handler.on_event(
        {"RequestType": "Delete", "PhysicalResourceId": "gpu-capacity-x", "ResourceProperties": properties()}
    )
    assert deleted == {"PhysicalResourceId": "gpu-capacity-x"}


STACK_ID = "arn:aws:cloudformation:us-east-1:111122223333:stack/RayLlmPdServing/5b6c1f30-0000-0000-0000-000000000000"


def _stack_status(status: str | None) -> Any:
    """CloudFormation's DescribeStacks of the check's own stack (None: AccessDenied)."""
    from botocore.stub import Stubber

    client = boto3.client("cloudformation", region_name=REGION)
    stub = Stubber(client)
    if status is None:
        stub.add_client_error("describe_stacks", "AccessDenied", expected_params={"StackName": STACK_ID})
    else:
        stack = {"StackName": "RayLlmPdServing", "StackId": STACK_ID, "StackStatus": status,
                 "CreationTime": "2026-12-01T00:00:00Z"}  # fmt: skip
        stub.add_response("describe_stacks", {"Stacks": [stack]}, {"StackName": STACK_ID})
    stub.activate()
    return client


def _update(monkeypatch: pytest.MonkeyPatch, status: str | None, quota: float) -> dict[str, Any]:
    clients = {"service-quotas": quotas(quota), "cloudformation": _stack_status(status)}
    real_client = boto3.client
    monkeypatch.setattr(boto3, "client", lambda name, **kw: clients.get(name) or real_client(name))
    event = {"RequestType": "Update", "StackId": STACK_ID, "PhysicalResourceId": "gpu-capacity-ray-llm-multinode",
             "ResourceProperties": properties(),
             "OldResourceProperties": properties(gpu=("g6.8xlarge", 1))}  # fmt: skip
    return dict(handler.on_event(event))


def test_a_rollback_is_never_refused_the_state_it_returns_to(ec2: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """CloudFormation rolls back with an Update of the old properties; the quota has moved since
    (32 vCPUs, 64 needed). Failing here would leave the stack UPDATE_ROLLBACK_FAILED: the check
    reads its stack's status and reports instead."""
    data = _update(monkeypatch, "UPDATE_ROLLBACK_IN_PROGRESS", 32)["Data"]
    assert data["Checks"].startswith(f"{handler.NOT_ENFORCED} (stack UPDATE_ROLLBACK_IN_PROGRESS): G/VT vCPU quota")


def test_a_forward_update_is_still_refused(ec2: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(handler.CapacityCheckFailed, match="G/VT vCPU quota: 32 free"):
        _update(monkeypatch, "UPDATE_IN_PROGRESS", 32)


def test_an_unreadable_stack_status_does_not_fail_the_update(ec2: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """It might be a rollback: a skipped check costs an early message, a failed rollback a stuck stack."""
    data = _update(monkeypatch, None, 32)["Data"]
    assert data["Checks"].startswith(f"{handler.NOT_ENFORCED} (stack status unreadable (ClientError")


def test_the_asset_folder_runs_as_lambda_loads_it() -> None:
    """Lambda imports handler.py as a top-level module from the asset root."""
    script = (
        f"import json, sys; sys.path.insert(0, {str(CODE_DIR)!r}); import handler; "
        "print(json.dumps([handler.on_event({'RequestType': 'Delete', 'ResourceProperties': {'ClusterName': 'c'}}), "
        "handler.checks.__name__, 'eks_pd_serving' in sys.modules]))"
    )
    result = subprocess.run(
        [sys.executable, "-I", "-c", script], env=NO_AWS_ENV, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [{"PhysicalResourceId": "gpu-capacity-c"}, "checks", False]


BLOCK = "cr-0123456789abcdef0"
GROUP_ARN = "arn:aws:resource-groups:us-east-1:123456789012:group/gpu-odcrs"


def reserved(name: str, instance_type: str, nodes: int, kind: str = "capacity-block", target: str = BLOCK) -> Any:
    return checks.ReservedGroup(name, instance_type, nodes, kind, target, f"{name}_gpu_capacity")


def quota_row(found: list[checks.Check], family: str) -> checks.Check:
    (row,) = [c for c in found if c.name == f"{family} vCPU quota"]
    return row


def test_nodes_that_launch_into_a_named_reservation_are_not_held_to_the_on_demand_quota(ec2: Any) -> None:
    """A new account's P quota is often 0: a Capacity Block (or ODCR) group must not be refused for it.
    The reservation check holds the group to the reservation's free instances instead."""
    needs = [checks.GroupNeed("prefill", "p5.48xlarge", 1), checks.GroupNeed("decode", "p5.48xlarge", 1)]
    block = reserved("prefill", "p5.48xlarge", 1)
    # Without the reservation both nodes count, and a P quota of 192 is one node short.
    assert not quota_row(checks.check_capacity(ec2, quotas(None, p_value=192), needs, "us-east-1a"), "P").passed
    row = quota_row(checks.check_capacity(ec2, quotas(None, p_value=192), needs, "us-east-1a", reserved=[block]), "P")
    assert row == checks.Check(
        "P vCPU quota", True, "192 free (192 quota - 0 running), 192 needed (1 x 192 vCPUs); prefill launch into a "
        "reservation, not counted"
    )  # fmt: skip
    both = [block, reserved("decode", "p5.48xlarge", 1, kind="odcr", target="cr-0fedcba9876543210")]
    row = quota_row(checks.check_capacity(ec2, quotas(None, p_value=0), needs, "us-east-1a", reserved=both), "P")
    assert row == checks.Check("P vCPU quota", True, "not counted: prefill, decode launch into a reservation")


def test_a_reservation_group_is_still_held_to_the_quota(ec2: Any) -> None:
    """Its reservations are not read, so nothing says they have room: the nodes count."""
    needs = [checks.GroupNeed("gpu", "g6.8xlarge", 2)]
    pool = reserved("gpu", "g6.8xlarge", 2, kind="odcr-group", target=GROUP_ARN)
    row = quota_row(checks.check_capacity(ec2, quotas(32), needs, "us-east-1a", reserved=[pool]), "G/VT")
    assert not row.passed and "64 needed" in row.detail


def test_the_deploy_time_check_passes_its_reservations_to_the_quota(ec2: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checks, "check_reservations", lambda *a, **kw: ([], {}))
    props = properties(prefill=("p5.48xlarge", 1))
    props["Reservations"] = [
        {"Name": "prefill", "InstanceType": "p5.48xlarge", "MaxNodes": "1", "Kind": "capacity-block",
         "Target": BLOCK, "Setting": "prefill_gpu_capacity"},
    ]  # fmt: skip
    data = handler.run_checks(props, ec2, quotas(None, p_value=0))
    assert "P vCPU quota: not counted: prefill launch into a reservation" in data["Checks"]


class _Blocks:
    """moto's EC2 with DescribeCapacityReservations answered as given: the block's row, or a
    ClientError code (moto does not hold Capacity Blocks)."""

    def __init__(self, ec2: Any, answer: dict[str, Any] | str) -> None:
        self.ec2, self.answer = ec2, answer

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ec2, name)

    def describe_capacity_reservations(self, **kwargs: Any) -> dict[str, Any]:
        from botocore.exceptions import ClientError

        if isinstance(self.answer, str):
            raise ClientError({"Error": {"Code": self.answer, "Message": "x"}}, "DescribeCapacityReservations")
        return {"CapacityReservations": [self.answer]}


@pytest.mark.parametrize("answer", ["ended", "unreadable"])
def test_a_waived_check_still_gives_every_block_its_schedule_times(
    ec2: Any, answer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rollback waives a failed Capacity Block check, but the block's two schedules GetAtt
    ScaleDownAt<g> and WarnAt<g>: without them the rollback itself fails (UPDATE_ROLLBACK_FAILED).
    Every block group gets both, in the future: from the block's end where it was read, else a
    warning within the hour and no blind scale-down."""
    import datetime

    now = datetime.datetime(2026, 12, 5, 12, 0, tzinfo=datetime.UTC)
    row = {"CapacityReservationId": BLOCK, "InstanceType": "g6.8xlarge", "AvailabilityZone": "us-east-1a",
           "State": "expired", "AvailableInstanceCount": 0, "EndDate": now - datetime.timedelta(hours=1)}  # fmt: skip
    client = _Blocks(ec2, row if answer == "ended" else "AccessDenied")
    props = properties()
    props["Reservations"] = [
        {"Name": "gpu", "InstanceType": "g6.8xlarge", "MaxNodes": "2", "Kind": "capacity-block",
         "Target": BLOCK, "Setting": "gpu_capacity"},
    ]  # fmt: skip
    with pytest.raises(handler.CapacityCheckFailed, match="Capacity"):
        handler.run_checks(props, client, quotas(None), now=now)
    data = handler.run_checks(props, client, quotas(None), now=now, waived="stack UPDATE_ROLLBACK_IN_PROGRESS")
    scale_down, warn = checks.block_attributes("gpu")
    assert data[warn] == "at(2026-12-05T13:00:00)"  # within the hour: someone must look
    expected = "at(2026-12-05T13:00:00)" if answer == "ended" else "at(2027-12-05T12:00:00)"
    assert data[scale_down] == expected
