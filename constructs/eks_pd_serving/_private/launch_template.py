"""Launch-template pieces every node group shares: an encrypted gp3 root volume and IMDSv2 (its hop
limit per node group)."""

from __future__ import annotations

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


def root_volume(size_gib: int) -> _L.BlockDeviceMappingProperty:
    return _L.BlockDeviceMappingProperty(
        device_name=ROOT_DEVICE,
        ebs=_L.EbsProperty(volume_size=size_gib, volume_type="gp3", encrypted=True, delete_on_termination=True),
    )


def imds_v2(hop_limit: int) -> _L.MetadataOptionsProperty:
    return _L.MetadataOptionsProperty(
        http_endpoint="enabled", http_tokens="required", http_put_response_hop_limit=hop_limit
    )


def latest(launch_template: ec2.CfnLaunchTemplate) -> eks.LaunchTemplateSpec:
    """A managed node group follows the template's latest version (a change rolls the nodes)."""
    return eks.LaunchTemplateSpec(id=launch_template.ref, version=launch_template.attr_latest_version_number)
