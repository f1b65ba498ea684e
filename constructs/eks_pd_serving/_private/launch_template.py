"""Launch-template pieces every node group shares: an encrypted gp3 root volume and IMDSv2."""

from __future__ import annotations

from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks

# The root device of the AL2023 EKS AMIs.
ROOT_DEVICE = "/dev/xvda"
# Pods reach IMDS through one extra network hop; 2 keeps IMDSv2 usable from them.
IMDS_HOP_LIMIT = 2

_L = ec2.CfnLaunchTemplate


def root_volume(size_gib: int) -> _L.BlockDeviceMappingProperty:
    return _L.BlockDeviceMappingProperty(
        device_name=ROOT_DEVICE,
        ebs=_L.EbsProperty(volume_size=size_gib, volume_type="gp3", encrypted=True, delete_on_termination=True),
    )


def imds_v2() -> _L.MetadataOptionsProperty:
    return _L.MetadataOptionsProperty(
        http_endpoint="enabled", http_tokens="required", http_put_response_hop_limit=IMDS_HOP_LIMIT
    )


def latest(launch_template: ec2.CfnLaunchTemplate) -> eks.LaunchTemplateSpec:
    """A managed node group follows the template's latest version (a change rolls the nodes)."""
    return eks.LaunchTemplateSpec(id=launch_template.ref, version=launch_template.attr_latest_version_number)
