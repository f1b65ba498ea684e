"""GPU capacity people can buy (issue 41, first part): ``gpu_capacity`` / ``prefill_capacity`` /
``decode_capacity`` as launch-template reservation targets, Capacity Block market options and
node-group capacity types, with no stack placement group where a reservation brings its own; and
preflight's reading of each reservation (Stubber: DescribeCapacityReservations). What EC2 and EKS
do with a matching reservation at launch is on paper (AWS's EC2 and EKS guides)."""

from __future__ import annotations

import datetime
import json
from functools import cache
from pathlib import Path
from typing import Any

import boto3
import pytest
from aws_cdk.assertions import Template
from botocore.stub import Stubber
from support import build_stack, cfn_lint, resources_of_type, synth_assembly

from eks_pd_serving.cli import preflight
from eks_pd_serving.config import ConfigError, DeploymentConfig

CR = "cr-0123456789abcdef0"
GROUP = "arn:aws:resource-groups:us-east-1:123456789012:group/gpu-reservations"
AZ: dict[str, Any] = {"availability_zones": "us-east-1a,us-east-1b", "gpu_availability_zone": "us-east-1a"}
NOW = datetime.datetime(2026, 12, 3, 12, 0, tzinfo=datetime.UTC)


@cache
def synthesized(**settings: Any) -> dict[str, Any]:
    return dict(Template.from_stack(build_stack(**settings)).to_json())


def launch_data(template: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        lt["Properties"]["LaunchTemplateData"]
        for lt in resources_of_type(template, "AWS::EC2::LaunchTemplate").values()
        if "NetworkInterfaces" in lt["Properties"]["LaunchTemplateData"]  # the GPU groups'
    ]


def gpu_nodegroups(template: dict[str, Any]) -> list[dict[str, Any]]:
    return [g["Properties"] for g in resources_of_type(template, "AWS::EKS::Nodegroup").values()
            if g["Properties"].get("Labels", {}).get("role") == "gpu-worker"]  # fmt: skip


def test_on_demand_keeps_the_placement_group_and_targets_nothing() -> None:
    template = synthesized()
    (data,) = launch_data(template)
    assert "Placement" in data and "CapacityReservationSpecification" not in data
    assert len(resources_of_type(template, "AWS::EC2::PlacementGroup")) == 1
    assert all("CapacityType" not in g for g in gpu_nodegroups(template))


def test_an_odcr_is_targeted_and_brings_its_own_placement() -> None:
    template = synthesized(gpu_capacity=f"odcr:{CR}", **AZ)
    (data,) = launch_data(template)
    assert data["CapacityReservationSpecification"] == {"CapacityReservationTarget": {"CapacityReservationId": CR}}
    assert "Placement" not in data and "InstanceMarketOptions" not in data
    assert resources_of_type(template, "AWS::EC2::PlacementGroup") == {}
    assert all("CapacityType" not in g for g in gpu_nodegroups(template))  # EKS's ON_DEMAND


def test_a_reservation_group_is_targeted_by_its_arn() -> None:
    (data,) = launch_data(synthesized(gpu_capacity=f"odcr-group:{GROUP}", **AZ))
    target = data["CapacityReservationSpecification"]["CapacityReservationTarget"]
    assert target == {"CapacityReservationResourceGroupArn": GROUP}


def test_a_capacity_block_is_the_node_groups_capacity_type_and_the_templates_market() -> None:
    template = synthesized(gpu_capacity=f"capacity-block:{CR}", **AZ)
    (data,) = launch_data(template)
    assert data["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    assert data["CapacityReservationSpecification"]["CapacityReservationTarget"] == {"CapacityReservationId": CR}
    assert [g["CapacityType"] for g in gpu_nodegroups(template)] == ["CAPACITY_BLOCK"]
    assert resources_of_type(template, "AWS::EC2::PlacementGroup") == {}


def test_spot_prefill_beside_an_on_demand_decode() -> None:
    template = synthesized(gpu_layout="per_phase", prefill_capacity="spot")
    types = sorted(g.get("CapacityType", "ON_DEMAND (EKS default)") for g in gpu_nodegroups(template))
    assert types == ["ON_DEMAND (EKS default)", "SPOT"]
    assert len(resources_of_type(template, "AWS::EC2::PlacementGroup")) == 2


def test_a_capacity_block_template_passes_cfn_lint_and_cdk_nag(tmp_path: Path) -> None:
    # With alarm_email: the block's warning publishes to the KMS-encrypted alarm topic.
    path = synth_assembly(tmp_path, gpu_capacity=f"capacity-block:{CR}", alarm_email="ops@example.com", **AZ)
    assert [f for f in cfn_lint(path) if f["Level"] == "Error"] == []


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"gpu_capacity": "odcr:cr-1"}, "not a capacity option"),
        ({"gpu_capacity": "reserved"}, "not a capacity option"),
        ({"gpu_capacity": "spot"}, "gpu_capacity='spot' for the group that runs decode"),
        (
            {"gpu_layout": "per_phase", "decode_capacity": "spot"},
            "decode_capacity='spot' for the group that runs decode",
        ),
        ({"prefill_capacity": "spot"}, "has no effect with gpu_layout='shared'"),
        ({"gpu_capacity": f"odcr:{CR}"}, "without gpu_availability_zone"),
        ({"gpu_capacity": f"capacity-block:{CR}", "autoscaling": True, **AZ}, "with autoscaling=true"),
    ],
)
def test_capacity_that_cannot_work_is_refused_in_one_line(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        DeploymentConfig.create(**settings)
    assert "\n" not in str(raised.value)


# --- preflight ----------------------------------------------------------------------------------
def reservation(**overrides: Any) -> dict[str, Any]:
    found = {
        "CapacityReservationId": CR, "InstanceType": "g6.8xlarge", "AvailabilityZone": "us-east-1a",
        "Tenancy": "default", "InstancePlatform": "Linux/UNIX", "State": "active",
        "TotalInstanceCount": 2, "AvailableInstanceCount": 2,
        "EndDate": NOW + datetime.timedelta(days=2),
    }  # fmt: skip
    return {k: v for k, v in {**found, **overrides}.items() if v is not None}


OWN_NODES = {
    "Filters": [
        {"Name": "instance-state-name", "Values": ["pending", "running"]},
        {"Name": "tag:eks:cluster-name", "Values": ["ray-llm-multinode"]},
    ]
}


def add_reservation(stub: Stubber, found: dict[str, Any] | None, own_nodes: int = 0) -> None:
    """DescribeCapacityReservations' answer, then (when found) this cluster's nodes in it."""
    params = {"CapacityReservationIds": [CR]}
    if found is None:
        stub.add_client_error("describe_capacity_reservations", "InvalidCapacityReservationId.NotFound",
                              expected_params=params)  # fmt: skip
        return
    stub.add_response("describe_capacity_reservations", {"CapacityReservations": [found]}, params)
    nodes = [{"InstanceId": f"i-{n:017x}", "CapacityReservationId": CR} for n in range(own_nodes)]
    stub.add_response("describe_instances", {"Reservations": [{"Instances": nodes}]}, OWN_NODES)


def ec2_client(found: dict[str, Any] | None, own_nodes: int = 0) -> tuple[Any, Stubber]:
    client = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(client)
    add_reservation(stub, found, own_nodes)
    stub.activate()
    return client, stub


def rows(found: dict[str, Any] | None, own_nodes: int = 0, **settings: Any) -> list[tuple[str, bool, str]]:
    client, stub = ec2_client(found, own_nodes)
    config = DeploymentConfig.create(**{"gpu_capacity": f"capacity-block:{CR}", **AZ, **settings})
    found_rows = preflight.check_reservations(client, config, "us-east-1a", now=NOW)
    stub.assert_no_pending_responses()
    return found_rows


def check(found: dict[str, Any] | None, **settings: Any) -> tuple[str, bool, str]:
    return rows(found, **settings)[0]


def test_preflight_passes_a_reservation_that_fits() -> None:
    name, passed, detail = check(reservation())
    assert (name, passed) == ("Capacity (gpu)", True) and "g6.8xlarge in us-east-1a, 2 free, until" in detail


@pytest.mark.parametrize(
    ("found", "message"),
    [
        (None, "InvalidCapacityReservationId.NotFound. Fix: name a reservation of this account and region"),
        (reservation(InstanceType="p5.48xlarge"), "it reserves p5.48xlarge, the group runs g6.8xlarge"),
        (reservation(AvailabilityZone="us-east-1d"), "it is in us-east-1d, the GPU AZ is us-east-1a"),
        (reservation(AvailableInstanceCount=1), "1 instance(s) free, the groups on it need 2"),
        (reservation(Tenancy="dedicated"), "its tenancy is dedicated"),
        (reservation(InstancePlatform="Windows"), "its platform is Windows"),
        (reservation(State="scheduled", StartDate=NOW + datetime.timedelta(hours=5)), "deploy after that"),
        (reservation(State="expired"), "its state is expired"),
        (reservation(EndDate=NOW + datetime.timedelta(minutes=30)), "within 2:00:00 (nodes are terminated then)"),
    ],
)
def test_preflight_refuses_each_mismatch_with_its_line(found: dict[str, Any] | None, message: str) -> None:
    _, passed, detail = check(found)
    assert passed is False and message in detail and "Fix:" in detail


def test_two_groups_on_one_reservation_need_their_sum() -> None:
    client, stub = ec2_client(one := reservation(AvailableInstanceCount=1))
    add_reservation(stub, one)
    config = DeploymentConfig.create(gpu_layout="per_phase", gpu_capacity=f"odcr:{CR}", **AZ)
    rows = preflight.check_reservations(client, config, "us-east-1a", now=NOW)
    assert [r[1] for r in rows] == [False, False] and all("the groups on it need 2" in r[2] for r in rows)
    assert json.dumps(rows).count(CR) == 2


def test_an_update_counts_the_clusters_own_nodes_in_the_reservation_as_free() -> None:
    """A block whose two instances the running group already holds: AvailableInstanceCount 0, but
    the deploy-time check of an update (and preflight before it) must not refuse the nodes it runs."""
    _, passed, detail = rows(reservation(AvailableInstanceCount=0), own_nodes=2)[0]
    assert passed, detail
    _, refused, _ = rows(reservation(AvailableInstanceCount=0), own_nodes=1)[0]
    assert refused is False


def test_preflight_says_when_a_blocks_group_scales_to_zero_and_is_warned() -> None:
    """A block ending in two days: scaled to zero an hour before its end (EC2 starts terminating
    30 minutes before it), warned a day before."""
    end = NOW + datetime.timedelta(days=2)
    (_, (name, passed, detail)) = rows(reservation(EndDate=end))
    assert (name, passed) == ("Capacity Block end (gpu)", True)
    scale_down = (end - datetime.timedelta(hours=1)).isoformat()
    warn = (end - datetime.timedelta(days=1)).isoformat()
    assert detail == f"ends {end.isoformat()}: the group scales to zero at {scale_down}, the warning goes out at {warn}"


# --- a Capacity Block's end ---------------------------------------------------------------------
def schedules(template: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """(group, action) -> the schedule's properties, its target input parsed with tokens as names."""
    found = {}
    for props in (r["Properties"] for r in resources_of_type(template, "AWS::Scheduler::Schedule").values()):
        parts = props["Target"]["Input"]["Fn::Join"][1]
        text = "".join(p if isinstance(p, str) else json.dumps(p).replace('"', "'") for p in parts)
        event = json.loads(text)
        found[(event["group"], event["action"])] = {**props, "event": event}
    return found


def test_a_capacity_block_group_is_scaled_to_zero_and_warned_at_times_read_from_the_block() -> None:
    template = synthesized(gpu_capacity=f"capacity-block:{CR}", **AZ)
    (check,) = [k for k, r in template["Resources"].items() if r["Type"] == "Custom::GpuCapacityCheck"]
    found = schedules(template)
    assert set(found) == {("gpu", "scale-down"), ("gpu", "warn")}
    for (_, action), props in found.items():
        attribute = {"scale-down": "ScaleDownAtGpu", "warn": "WarnAtGpu"}[action]
        assert props["ScheduleExpression"] == {"Fn::GetAtt": [check, attribute]}
        assert props["ScheduleExpressionTimezone"] == "UTC" and props["FlexibleTimeWindow"] == {"Mode": "OFF"}
        assert props["event"]["reservation"] == CR and "NodegroupName" in props["event"]["nodegroup"]
        assert props["Name"].startswith("ray-llm-multinode-") and len(props["Name"]) <= 64
    (reservations,) = [r["Properties"]["Reservations"] for r in template["Resources"].values()
                       if r["Type"] == "Custom::GpuCapacityCheck"]  # fmt: skip
    assert reservations == [{"Name": "gpu", "InstanceType": "g6.8xlarge", "MaxNodes": "2", "Kind": "capacity-block",
                             "Target": CR, "Setting": "gpu_capacity"}]  # fmt: skip


def test_only_the_block_group_gets_schedules_and_an_odcr_none() -> None:
    per_phase = synthesized(gpu_layout="per_phase", decode_capacity=f"capacity-block:{CR}", **AZ)
    assert set(schedules(per_phase)) == {("decode", "scale-down"), ("decode", "warn")}
    assert schedules(synthesized(gpu_capacity=f"odcr:{CR}", **AZ)) == {}
    assert schedules(synthesized()) == {}


def test_the_schedule_names_fit_and_never_collide() -> None:
    from eks_pd_serving.capacity_block_end import schedule_name

    long_a, long_b = "a" * 90 + "-one", "a" * 90 + "-two"
    names = {schedule_name(n, "decode", a) for n in (long_a, long_b) for a in ("warn", "scale-down")}
    assert len(names) == 4 and all(len(n) <= 64 for n in names)


# --- cost and offerings per option ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("settings", "price", "note"),
    [
        ({}, 2.0144, ""),
        ({"gpu_capacity": f"odcr:{CR}", **AZ}, 2.0144, "On-Demand Capacity Reservation: billed at the on-demand rate"),
        ({"gpu_capacity": f"capacity-block:{CR}", **AZ}, 0.0, "Capacity Block: prepaid up front, not in this total"),
    ],
    ids=["on-demand", "odcr", "capacity-block"],
)
def test_cost_prices_each_capacity_option(settings: dict[str, Any], price: float, note: str) -> None:
    from eks_pd_serving.cli import cost

    lines, _ = cost.estimate(synthesized(**settings), "us-east-1", datetime.date(2026, 12, 4))
    (gpu,) = [line for line in lines if line.item == "g6.8xlarge nodes"]
    assert gpu.unit_price == price and gpu.note.startswith(note)


def test_cost_prices_a_block_at_its_given_price_and_spot_at_its_ceiling() -> None:
    from eks_pd_serving.cli import cost

    block, _ = cost.estimate(synthesized(gpu_capacity=f"capacity-block:{CR}", **AZ), "us-east-1",
                             datetime.date(2026, 12, 4), capacity_block_price=1.25)  # fmt: skip
    assert [(ln.quantity, ln.unit_price) for ln in block if ln.item == "g6.8xlarge nodes"] == [(2, 1.25)]
    spot, _ = cost.estimate(synthesized(gpu_layout="per_phase", prefill_capacity="spot"), "us-east-1",
                            datetime.date(2026, 12, 4))  # fmt: skip
    notes = sorted(ln.note.split(":")[0] for ln in spot if ln.item == "g6.8xlarge nodes")
    assert notes == ["", "spot"]


def test_preflight_lists_the_cheapest_block_offering_in_the_gpu_az() -> None:
    client, stub = ec2_client_empty()
    offer = {"CapacityBlockOfferingId": "cb-0123456789abcdef0", "InstanceType": "g6.8xlarge", "InstanceCount": 2,
             "CapacityBlockDurationHours": 48, "UpfrontFee": "192.00", "CurrencyCode": "USD",
             "StartDate": NOW, "EndDate": NOW + datetime.timedelta(hours=48)}  # fmt: skip
    here, dearer, there = (
        {**offer, "AvailabilityZone": "us-east-1a"},
        {**offer, "AvailabilityZone": "us-east-1a", "UpfrontFee": "300.00"},
        {**offer, "AvailabilityZone": "us-east-1c", "UpfrontFee": "10.00"},
    )
    params = {"InstanceType": "g6.8xlarge", "InstanceCount": 2, "CapacityDurationHours": 48}
    stub.add_response("describe_capacity_block_offerings", {"CapacityBlockOfferings": [here, dearer, there]}, params)
    stub.add_response("describe_capacity_block_offerings", {"CapacityBlockOfferings": [there]}, params)
    config = DeploymentConfig.create()
    (row,) = preflight.block_offerings(client, config, "us-east-1a", 48)
    assert row[2].endswith("USD 192.00 up front = 2.0000 per instance-hour (cost --capacity-block-price 2.0000)")
    (none,) = preflight.block_offerings(client, config, "us-east-1a", 48)
    assert none[2] == "none of 2 x g6.8xlarge for 48 h in us-east-1a (offered in us-east-1c)"


@pytest.mark.parametrize("hours", ["48", "336", "504", "4368"])
def test_block_hours_takes_the_durations_ec2_sells(hours: str) -> None:
    assert preflight.block_hours(hours) == int(hours)


@pytest.mark.parametrize("hours", ["0", "36", "360", "4369", "two"])
def test_block_hours_refuses_others_in_one_line(hours: str) -> None:
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match=f"--block-hours='{hours}' is not a Capacity Block duration"):
        preflight.block_hours(hours)


def ec2_client_empty() -> tuple[Any, Stubber]:
    client = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(client)
    stub.activate()
    return client, stub


def test_synth_states_that_spot_prefill_has_no_on_demand_floor_and_a_silent_block_end() -> None:
    spot = DeploymentConfig.create(gpu_layout="per_phase", prefill_capacity="spot").warnings()
    assert any(w.startswith("prefill_capacity=spot has no on-demand floor") for w in spot)
    block = DeploymentConfig.create(gpu_capacity=f"capacity-block:{CR}", **AZ).warnings()
    assert any("Capacity Block without alarm_email" in w for w in block)
    told = DeploymentConfig.create(gpu_capacity=f"capacity-block:{CR}", alarm_email="ops@example.com", **AZ)
    assert not any("Capacity Block" in w for w in told.warnings())
    assert not any("spot" in w or "Capacity Block" in w for w in DeploymentConfig.create().warnings())
