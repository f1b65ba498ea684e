"""Instance types synth knows, with the facts EC2 ``DescribeInstanceTypes`` reports for them.

Figures: vCPUs (``VCpuInfo.DefaultVCpus``), memory (``MemoryInfo.SizeInMiB``, in GiB), GPUs and one
GPU's memory in MiB as EC2 reports it (``GpuInfo.Gpus[0].MemoryInfo.SizeInMiB``, not the marketed
size), EFA interfaces (``EfaInfo.MaximumEfaInterfaces``), network bandwidth and the instance store
(``InstanceStorageInfo.TotalSizeInGB``, from moto's copy of EC2's DescribeInstanceTypes data, which the
preflight test reads). Source: the
Karpenter provider's generated tables of these API fields (aws/karpenter-provider-aws commit
1d927085dd81, website/content/en/docs/reference/instance-types.md, generated 2026-07-11;
pkg/providers/instancetype/zz_generated.vpclimits.go for network cards; zz_generated.bandwidth.go
for bandwidth), checked against its raw DescribeInstanceTypes fixture for p5.48xlarge and
g5.12xlarge. `preflight` compares every GPU type used with the live API. A type missing here is
refused with the list of known ones; adding a row is the fix.

EFA layout. An instance with one EFA interface gets one interface of type ``efa`` (EFA with ENA) on
network card 0, as the reference deployment does. One with several network cards gets AWS's
layout for them (EC2 user guide, "Maximize network bandwidth on Amazon EC2 instances with
multiple network cards", efa-acc-inst-types, use case "saves IPs" for p5/p5e): the primary ENA
interface on card 0 device 0, an ``efa-only`` interface on card 0 device 1, and an ``efa-only``
interface on device 0 of every further card; EFA-only interfaces take no IP address, so the pod
network (the VPC CNI, on the ENA interface) is unchanged. Where card 0 carries no EFA device
(p6-b300.48xlarge: DescribeInstanceTypes lists its card 0 with ``InterfaceTypes: [interface]`` and
16 EFA cards after it), card 0 keeps the primary ENA interface alone and each EFA card, from card
1, gets one ``efa-only`` interface. Rows of g7e, p6-b200 and p6-b300 are held equal to the
DescribeInstanceTypes data moto 5.2 carries (recorded from EC2), card 0's EFA support included.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from .. import versions


@dataclass(frozen=True)
class GpuFacts:
    memory_mib: int  # one GPU, as EC2 reports it
    memory_bandwidth_gbps: float  # GB/s, the decode step-time floor of `sizing`'s what-if table


def gpu_slug(name: str) -> str:
    """A GPU name as one lower-case token ("RTX PRO Server 6000" -> "rtx-pro-server-6000"): valid
    in a Kubernetes label value and on a command line without quotes."""
    return re.sub(r"[^a-z0-9.]+", "-", name.lower()).strip("-")


# Memory bandwidth, GB/s, as published for these parts (no AWS API reports it): L4 300, H100 SXM
# 3,350 and H200 SXM 4,800 from Google Cloud's GPU table (docs.cloud.google.com/compute/docs/gpus),
# L40S 864 (Scaleway's GPU instance guide), A100 40 GB 1,550 (NVIDIA's Ampere tuning guide, 1.4.2.1),
# A10G 600 (a third-party comparison; AWS's A10G datasheet says the same, unread here); RTX PRO
# Server 6000 (g7e) 1,792 (third-party spec tables of the RTX PRO 6000 Blackwell, 2025: 28 Gbps
# GDDR7, 512-bit), B200 8,000 (Vultr's HGX B200 hardware overview, 2026) and B300 8,000 ("up to"
# 8 TB/s, third-party HGX B300 spec tables, 2026). Memory as EC2 reports it (moto 5.2's recording).
GPUS: Final[dict[str, GpuFacts]] = {
    "L4": GpuFacts(22888, 300.0),
    "L40S": GpuFacts(45776, 864.0),
    "A10G": GpuFacts(22888, 600.0),
    "A100": GpuFacts(40960, 1550.0),
    "H100": GpuFacts(81920, 3350.0),
    "H200": GpuFacts(144384, 4800.0),
    "RTX PRO Server 6000": GpuFacts(98304, 1792.0),
    "B200": GpuFacts(183359, 8000.0),
    "B300": GpuFacts(275040, 8000.0),
}
GPU_MEMORY_BANDWIDTH_GBPS: Final = {name: gpu.memory_bandwidth_gbps for name, gpu in GPUS.items()}


@dataclass(frozen=True)
class EfaInterface:
    network_card: int
    device: int
    interface_type: str  # "efa" (EFA with ENA), "efa-only", or "interface" (ENA)


@dataclass(frozen=True)
class InstanceFacts:
    vcpus: int
    memory_gib: int
    gpus: int = 0
    gpu_name: str = ""
    efa_interfaces: int = 0
    network_gbps: float = 0.0
    #: Whether network card 0 carries an EFA device (p6-b300's does not: its EFA cards start at 1).
    efa_on_card_zero: bool = True
    #: The instance store's NVMe disks, in GB (``InstanceStorageInfo.TotalSizeInGB``; 0: none), where
    #: nodeadm's localStorage puts images, the weights and the compile caches instead of the root volume.
    instance_store_gb: int = 0

    @property
    def gpu_memory_mib(self) -> int:
        return GPUS[self.gpu_name].memory_mib if self.gpus else 0

    @property
    def efa_supported(self) -> bool:
        return self.efa_interfaces > 0

    @property
    def network_interfaces(self) -> tuple[EfaInterface, ...]:
        """The launch template's interfaces: one ``efa`` interface where the type has one EFA;
        else the primary ENA interface and an ``efa-only`` interface per EFA network card (at most
        one EFA device per card), card 0's on device 1 where card 0 has one."""
        if self.efa_interfaces <= 1 and self.efa_on_card_zero:
            return (EfaInterface(0, 0, "efa"),)
        if not self.efa_on_card_zero:
            cards = range(1, self.efa_interfaces + 1)
            return (EfaInterface(0, 0, "interface"), *(EfaInterface(card, 0, "efa-only") for card in cards))
        further = tuple(EfaInterface(card, 0, "efa-only") for card in range(1, self.efa_interfaces))
        return (EfaInterface(0, 0, "interface"), EfaInterface(0, 1, "efa-only"), *further)


def _gpu(
    name: str, vcpus: int, memory_gib: int, gpus: int, efa: int, gbps: float, efa_on_card_zero: bool = True,
    *, store_gb: int,
) -> InstanceFacts:  # fmt: skip
    return InstanceFacts(vcpus, memory_gib, gpus, name, efa, gbps, efa_on_card_zero, store_gb)


INSTANCE_TYPES: Final[dict[str, InstanceFacts]] = {
    # General purpose, for the system node group (KubeRay operator, Ray head).
    "m7i.large": InstanceFacts(2, 8),
    "m7i.xlarge": InstanceFacts(4, 16),
    "m7i.2xlarge": InstanceFacts(8, 32),
    "m7i.4xlarge": InstanceFacts(16, 64),
    "m6i.xlarge": InstanceFacts(4, 16),
    "m6i.2xlarge": InstanceFacts(8, 32),
    "m5.xlarge": InstanceFacts(4, 16),
    "m5.2xlarge": InstanceFacts(8, 32),
    # NVIDIA L4.
    "g6.xlarge": _gpu("L4", 4, 16, 1, 0, 10, store_gb=250),
    "g6.2xlarge": _gpu("L4", 8, 32, 1, 0, 10, store_gb=450),
    "g6.4xlarge": _gpu("L4", 16, 64, 1, 0, 25, store_gb=600),
    "g6.8xlarge": _gpu("L4", 32, 128, 1, 1, 25, store_gb=900),
    "g6.12xlarge": _gpu("L4", 48, 192, 4, 1, 40, store_gb=3760),
    "g6.16xlarge": _gpu("L4", 64, 256, 1, 1, 25, store_gb=1880),
    "g6.24xlarge": _gpu("L4", 96, 384, 4, 1, 50, store_gb=3760),
    "g6.48xlarge": _gpu("L4", 192, 768, 8, 1, 100, store_gb=7520),
    # NVIDIA L40S.
    "g6e.xlarge": _gpu("L40S", 4, 32, 1, 0, 20, store_gb=250),
    "g6e.8xlarge": _gpu("L40S", 32, 256, 1, 1, 25, store_gb=900),
    "g6e.12xlarge": _gpu("L40S", 48, 384, 4, 1, 100, store_gb=3800),
    "g6e.24xlarge": _gpu("L40S", 96, 768, 4, 2, 200, store_gb=3800),
    "g6e.48xlarge": _gpu("L40S", 192, 1536, 8, 4, 400, store_gb=7600),
    # NVIDIA A10G (the EFA sizes).
    "g5.8xlarge": _gpu("A10G", 32, 128, 1, 1, 25, store_gb=900),
    "g5.12xlarge": _gpu("A10G", 48, 192, 4, 1, 40, store_gb=3800),
    "g5.16xlarge": _gpu("A10G", 64, 256, 1, 1, 25, store_gb=1900),
    "g5.24xlarge": _gpu("A10G", 96, 384, 4, 1, 50, store_gb=3800),
    "g5.48xlarge": _gpu("A10G", 192, 768, 8, 1, 100, store_gb=7600),
    # NVIDIA A100 40 GB: 4 network cards, an EFA on each.
    "p4d.24xlarge": _gpu("A100", 96, 1152, 8, 4, 400, store_gb=8000),
    # NVIDIA H100 / H200: 32 network cards on p5 and p5e, 16 on p5en; an EFA on each.
    "p5.48xlarge": _gpu("H100", 192, 2048, 8, 32, 3200, store_gb=30400),
    "p5e.48xlarge": _gpu("H200", 192, 2048, 8, 32, 3200, store_gb=30400),
    "p5en.48xlarge": _gpu("H200", 192, 2048, 8, 16, 3200, store_gb=30400),
    # NVIDIA RTX PRO Server 6000 (Blackwell, 96 GiB): one network card below 24xlarge.
    "g7e.8xlarge": _gpu("RTX PRO Server 6000", 32, 256, 1, 1, 100, store_gb=1900),
    "g7e.12xlarge": _gpu("RTX PRO Server 6000", 48, 512, 2, 1, 400, store_gb=3800),
    "g7e.24xlarge": _gpu("RTX PRO Server 6000", 96, 1024, 4, 2, 800, store_gb=7600),
    "g7e.48xlarge": _gpu("RTX PRO Server 6000", 192, 2048, 8, 4, 1600, store_gb=15200),
    # NVIDIA B200: 8 network cards, an EFA on each; B300: 17 cards, card 0 ENA only, 16 EFA after it.
    "p6-b200.48xlarge": _gpu("B200", 192, 2048, 8, 8, 3200, store_gb=30400),
    "p6-b300.48xlarge": _gpu("B300", 192, 4096, 8, 16, 6400, efa_on_card_zero=False, store_gb=30400),
}

# The EFA device plugin's DaemonSet runs only on the instance types its chart lists
# (supportedInstanceLabels): on any other type EFA is never advertised and the Ray workers, which
# request it, stay Pending. The chart's own values.yaml, vendored at the pinned chart version
# (aws/eks-charts commit bfe91c4b9257, stable/aws-efa-k8s-device-plugin, chart v0.5.30); the file
# name follows the pin, so a bump without the new values fails at import.
_EFA_CHART = versions.EFA_DEVICE_PLUGIN_CHART
EFA_PLUGIN_VALUES: Final = Path(__file__).parent / "upstream" / f"{_EFA_CHART.chart}-{_EFA_CHART.version}-values.yaml"


@functools.cache
def efa_plugin_instance_types() -> frozenset[str]:
    values = yaml.safe_load(EFA_PLUGIN_VALUES.read_text())
    return frozenset(values["supportedInstanceLabels"]["values"])


def mismatches(facts: InstanceFacts, info: dict[str, Any]) -> list[str]:
    """Where the catalogue's row differs from EC2's ``DescribeInstanceTypes`` entry ``info`` (the
    API's field names); empty when they agree."""
    gpus = (info.get("GpuInfo") or {}).get("Gpus") or [{}]
    network = info.get("NetworkInfo") or {}
    live = {
        "vCPUs": info["VCpuInfo"]["DefaultVCpus"],
        "memory GiB": info["MemoryInfo"]["SizeInMiB"] // 1024,
        "GPUs": gpus[0].get("Count", 0),
        "GPU": gpus[0].get("Name", ""),
        "GPU memory MiB": (gpus[0].get("MemoryInfo") or {}).get("SizeInMiB", 0),
        "EFA interfaces": (network.get("EfaInfo") or {}).get("MaximumEfaInterfaces", 0),
        "instance store GB": (info.get("InstanceStorageInfo") or {}).get("TotalSizeInGB", 0),
    }
    ours = {
        "vCPUs": facts.vcpus,
        "memory GiB": facts.memory_gib,
        "GPUs": facts.gpus,
        "GPU": facts.gpu_name,
        "GPU memory MiB": facts.gpu_memory_mib,
        "EFA interfaces": facts.efa_interfaces,
        "instance store GB": facts.instance_store_gb,
    }
    found = [f"{name} {ours[name]} here, {live[name]} in EC2" for name in ours if ours[name] != live[name]]
    cards = network.get("MaximumNetworkCards", 1)
    efa_cards = cards if facts.efa_on_card_zero else cards - 1
    if facts.efa_interfaces > efa_cards:
        found.append(f"{facts.efa_interfaces} EFA interfaces but {efa_cards} EFA network cards (one EFA per card)")
    card_zero = next((c for c in network.get("NetworkCards") or [] if c.get("NetworkCardIndex") == 0), None)
    if facts.efa_interfaces and card_zero is not None:
        live_zero = bool({"efa", "efa-only"} & set(card_zero.get("InterfaceTypes") or ()))
        if live_zero != facts.efa_on_card_zero:
            found.append(f"EFA on network card 0 {facts.efa_on_card_zero} here, {live_zero} in EC2")
    return found
