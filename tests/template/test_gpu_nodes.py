"""GPU nodes of every EFA layout: the launch template AWS's EFA guide describes for multi-card types
(P5 class, p4d, the large g6e), one EFA interface where the type has one, and Ray workers that
request every GPU and EFA device of their node."""

from __future__ import annotations

from typing import Any

import pytest
from aws_cdk.assertions import Template
from support import P5_CLASS, build_stack, ray_service, resources_of_type

from eks_pd_serving.catalog import INSTANCE_TYPES
from eks_pd_serving.config import DeploymentConfig


@pytest.fixture(scope="module")
def p5_template() -> dict[str, Any]:
    return dict(Template.from_stack(build_stack(**P5_CLASS)).to_json())


def _interfaces(template: dict[str, Any], group: str) -> list[dict[str, Any]]:
    (launch_template,) = (
        r for k, r in resources_of_type(template, "AWS::EC2::LaunchTemplate").items() if k.startswith(group)
    )
    return list(launch_template["Properties"]["LaunchTemplateData"]["NetworkInterfaces"])


def _layout(interfaces: list[dict[str, Any]]) -> list[tuple[int, int, str]]:
    return [(i["NetworkCardIndex"], i["DeviceIndex"], i["InterfaceType"]) for i in interfaces]


@pytest.mark.parametrize(("group", "cards"), [("PdServingPrefillGpuNodes", 32), ("PdServingDecodeGpuNodes", 16)])
def test_p5_class_nodes_get_the_efa_guides_layout(p5_template: dict[str, Any], group: str, cards: int) -> None:
    """EC2 user guide (efa-acc-inst-types): the primary ENA interface on card 0 device 0, an
    EFA-only interface on card 0 device 1 and on device 0 of every other card; one EFA per card,
    32 on p5.48xlarge, 16 on p5en.48xlarge."""
    interfaces = _interfaces(p5_template, group)
    expected = [(0, 0, "interface"), (0, 1, "efa-only")] + [(card, 0, "efa-only") for card in range(1, cards)]
    assert _layout(interfaces) == expected
    # Security groups on every interface (EKS adds none to a launch template's interfaces); no
    # public IP, which EC2 refuses with several interfaces and which EFA-only ones cannot take.
    groups = {str(i["Groups"]) for i in interfaces}
    assert len(groups) == 1 and len(interfaces[0]["Groups"]) == 2
    assert not any("AssociatePublicIpAddress" in i or "PrivateIpAddresses" in i for i in interfaces)


def test_single_efa_types_keep_one_efa_interface() -> None:
    """g6.8xlarge (the reference) and every other one-EFA type: one ``efa`` interface, as before."""
    template = dict(Template.from_stack(build_stack()).to_json())
    assert _layout(_interfaces(template, "PdServingGpuNodes")) == [(0, 0, "efa")]
    single = [name for name, facts in INSTANCE_TYPES.items() if facts.efa_interfaces == 1]
    assert all(
        INSTANCE_TYPES[name].network_interfaces == INSTANCE_TYPES["g6.8xlarge"].network_interfaces for name in single
    )


def test_every_multi_card_type_gets_one_efa_device_per_card() -> None:
    for name, facts in INSTANCE_TYPES.items():
        if facts.efa_interfaces > 1:
            efa = [i for i in facts.network_interfaces if i.interface_type != "interface"]
            assert len(efa) == facts.efa_interfaces, name
            assert len({i.network_card for i in efa}) == facts.efa_interfaces, name


def test_the_node_group_names_its_type_on_the_resource(p5_template: dict[str, Any]) -> None:
    """aws-cdk-lib 2.275 refuses the NVIDIA AMI for p5 (its GPU list stops at g6e): the type is set
    on the CloudFormation resource, where EKS checks it, with the NVIDIA AMI."""
    groups = resources_of_type(p5_template, "AWS::EKS::Nodegroup")
    gpu = {r["Properties"]["InstanceTypes"][0]: r["Properties"]["AmiType"] for r in groups.values()
           if r["Properties"]["InstanceTypes"][0].startswith("p5")}  # fmt: skip
    assert gpu == {"p5.48xlarge": "AL2023_x86_64_NVIDIA", "p5en.48xlarge": "AL2023_x86_64_NVIDIA"}


def test_ray_workers_request_every_gpu_and_efa_device_of_their_node() -> None:
    service = ray_service(**P5_CLASS)
    limits = {
        group["groupName"]: group["template"]["spec"]["containers"][0]["resources"]["limits"]
        for group in service["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    }
    assert {name: (lim["nvidia.com/gpu"], lim["vpc.amazonaws.com/efa"]) for name, lim in limits.items()} == {
        "prefill-workers": (8, 32),
        "decode-workers": (8, 16),
    }


def test_a_type_whose_card_zero_has_no_efa_starts_its_efa_interfaces_on_card_one() -> None:
    """p6-b300.48xlarge: DescribeInstanceTypes lists card 0 with ENA only and 16 EFA cards after it."""
    facts = INSTANCE_TYPES["p6-b300.48xlarge"]
    layout = [(i.network_card, i.device, i.interface_type) for i in facts.network_interfaces]
    assert layout == [(0, 0, "interface"), *((card, 0, "efa-only") for card in range(1, 17))]
    b200 = [(i.network_card, i.device, i.interface_type) for i in INSTANCE_TYPES["p6-b200.48xlarge"].network_interfaces]
    assert b200[:2] == [(0, 0, "interface"), (0, 1, "efa-only")] and len(b200) == 9


def test_the_catalogue_check_sees_a_wrong_card_zero() -> None:
    """The row held against EC2's record: card 0 claimed to carry EFA on p6-b300 is reported."""
    import dataclasses

    from eks_pd_serving.catalog import mismatches

    card = {"NetworkCardIndex": 0, "InterfaceTypes": ["interface"]}
    info = {
        "VCpuInfo": {"DefaultVCpus": 192}, "MemoryInfo": {"SizeInMiB": 4096 * 1024},
        "GpuInfo": {"Gpus": [{"Count": 8, "Name": "B300", "MemoryInfo": {"SizeInMiB": 275040}}]},
        "NetworkInfo": {"EfaInfo": {"MaximumEfaInterfaces": 16}, "MaximumNetworkCards": 17, "NetworkCards": [card]},
        "InstanceStorageInfo": {"TotalSizeInGB": 30400},
    }  # fmt: skip
    facts = INSTANCE_TYPES["p6-b300.48xlarge"]
    assert mismatches(facts, info) == []
    wrong = dataclasses.replace(facts, efa_on_card_zero=True)
    assert mismatches(wrong, info) == ["EFA on network card 0 True here, False in EC2"]


def test_the_accelerator_label_is_a_label_value() -> None:
    """EC2's GPU name has spaces (g7e's "RTX PRO Server 6000"); a node label value may not."""
    from eks_pd_serving.layout import ACCELERATOR_LABEL

    config = DeploymentConfig.create(gpu_instance_type="g7e.8xlarge", autoscaling=True, gpu_max_node_count=4)
    (group,) = config.gpu_groups
    assert group.node_labels[ACCELERATOR_LABEL] == "nvidia-rtx-pro-server-6000"
    (l4,) = DeploymentConfig.create(autoscaling=True, gpu_max_node_count=4).gpu_groups
    assert l4.node_labels[ACCELERATOR_LABEL] == "nvidia-l4"
