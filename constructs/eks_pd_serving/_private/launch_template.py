"""Launch-template pieces every node group shares: an encrypted gp3 root volume and IMDSv2 (its hop
limit per node group); the GPU groups' nodeadm configuration."""

from __future__ import annotations

from typing import Any

import yaml
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks

# The root device of the AL2023 EKS AMIs.
ROOT_DEVICE = "/dev/xvda"
# A pod off the host network reaches IMDS through one extra hop: 2 lets it, 1 lets only the node
# and host-network pods. The system nodes keep 2: the Ray scraper (a CloudWatch agent Deployment
# off the host network) reads the instance's metadata, and the controllers there may. The GPU
# nodes take 1: what reads IMDS there runs on the host network (aws-node, the Pod Identity agent,
# the EFA device plugin, the CloudWatch add-on's agent and Fluent Bit DaemonSets: chart 6.4.0
# values.yaml `agent.hostNetwork: true`, fluent-bit-daemonset.yaml `hostNetwork: true`), what does
# not (DCGM exporter, the NVIDIA device plugin) never calls it, and the Ray pods use Pod Identity
# with the region in their env, so no Ray pod can take the node's role.
SYSTEM_IMDS_HOP_LIMIT = 2
GPU_IMDS_HOP_LIMIT = 1

_L = ec2.CfnLaunchTemplate


def root_volume(size_gib: int, throughput_mib_s: int | None = None) -> _L.BlockDeviceMappingProperty:
    """``throughput_mib_s``: gp3's throughput (None: its included 125 MiB/s); its 3,000 included
    IOPS carry up to 750 MiB/s (gp3 allows 0.25 MiB/s per IOPS)."""
    return _L.BlockDeviceMappingProperty(
        device_name=ROOT_DEVICE,
        ebs=_L.EbsProperty(
            volume_size=size_gib, volume_type="gp3", encrypted=True, delete_on_termination=True,
            throughput=throughput_mib_s,
        ),
    )  # fmt: skip


def imds_v2(hop_limit: int) -> _L.MetadataOptionsProperty:
    return _L.MetadataOptionsProperty(
        http_endpoint="enabled", http_tokens="required", http_put_response_hop_limit=hop_limit
    )


def latest(launch_template: ec2.CfnLaunchTemplate) -> eks.LaunchTemplateSpec:
    """A managed node group follows the template's latest version (a change rolls the nodes)."""
    return eks.LaunchTemplateSpec(id=launch_template.ref, version=launch_template.attr_latest_version_number)


# nodeadm's configuration part (amazon-eks-ami nodeadm/doc/examples.md): EKS merges its own
# NodeConfig (the cluster's coordinates) with it, in the order of the parts.
_BOUNDARY = "EKSPDSERVING"
# The AMI's docs recommend at least 600 MiB/s of root volume throughput for FastImagePull.
FAST_PULL_ROOT_THROUGHPUT_MIB_S = 600


def root_throughput(*, fast_image_pull: bool, local_storage: bool, instance_store_gb: int) -> int | None:
    """The GPU root volume's gp3 throughput (None: the included 125 MiB/s). Raised for FastImagePull
    only while the root volume is what the pull writes: with localStorage on a type with an instance
    store, containerd's and SOCI's folders, the weights and the compile caches all live on the NVMe
    array, and the root volume holds the OS and kubelet's state alone."""
    if fast_image_pull and not (local_storage and instance_store_gb > 0):
        return FAST_PULL_ROOT_THROUGHPUT_MIB_S
    return None


def node_config(*, fast_image_pull: bool, local_storage: bool) -> str | None:
    """The launch template's user data for nodeadm (node.eks.aws/v1alpha1 NodeConfig), or None when
    it would say nothing. ``fast_image_pull``: the FastImagePull feature gate (SOCI's parallel
    pull and unpack). ``local_storage``: the instance store's NVMe disks as one RAID0 array at
    /mnt/k8s-disks/0, with containerd's, SOCI's, kubelet's and the pods' log directories bound
    onto it (nodeadm's defaults; a type without instance storage is left as it is)."""
    spec: dict[str, Any] = {}
    if fast_image_pull:
        spec["featureGates"] = {"FastImagePull": True}
    if local_storage:
        spec["instance"] = {"localStorage": {"strategy": "RAID0"}}
    if not spec:
        return None
    document = yaml.safe_dump({"apiVersion": "node.eks.aws/v1alpha1", "kind": "NodeConfig", "spec": spec},
                              sort_keys=False)  # fmt: skip
    return (
        f'MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary="{_BOUNDARY}"\n\n'
        f"--{_BOUNDARY}\nContent-Type: application/node.eks.aws\n\n---\n{document}\n--{_BOUNDARY}--\n"
    )
