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
    path = synth_assembly(tmp_path, gpu_capacity=f"capacity-block:{CR}", **AZ)  # nag raises on a finding
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


def ec2_client(found: dict[str, Any] | None) -> tuple[Any, Stubber]:
    client = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(client)
    params = {"CapacityReservationIds": [CR]}
    if found is None:
        stub.add_client_error("describe_capacity_reservations", "InvalidCapacityReservationId.NotFound",
                              expected_params=params)  # fmt: skip
    else:
        stub.add_response("describe_capacity_reservations", {"CapacityReservations": [found]}, params)
    stub.activate()
    return client, stub


def check(found: dict[str, Any] | None, **settings: Any) -> tuple[str, bool, str]:
    client, stub = ec2_client(found)
    config = DeploymentConfig.create(**{"gpu_capacity": f"capacity-block:{CR}", **AZ, **settings})
    (row,) = preflight.check_reservations(client, config, "us-east-1a", now=NOW)
    stub.assert_no_pending_responses()
    return row


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
    stub.add_response(
        "describe_capacity_reservations", {"CapacityReservations": [one]}, {"CapacityReservationIds": [CR]}
    )
    config = DeploymentConfig.create(gpu_layout="per_phase", gpu_capacity=f"odcr:{CR}", **AZ)
    rows = preflight.check_reservations(client, config, "us-east-1a", now=NOW)
    assert [r[1] for r in rows] == [False, False] and all("the groups on it need 2" in r[2] for r in rows)
    assert json.dumps(rows).count(CR) == 2
