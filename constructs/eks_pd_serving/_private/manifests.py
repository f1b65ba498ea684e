"""A cdk8s chart applied as a manifest that takes over objects that already exist."""

from __future__ import annotations

import cdk8s
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct


def adopting_manifest(cluster: eks.ICluster, id: str, chart: cdk8s.Chart) -> eks.KubernetesManifest:
    """``chart`` as a manifest that applies on create (``overwrite``), so an update from a version
    that had its objects in another manifest finds them in place (`kubectl create` would fail on
    them). That other manifest must depend on this one, so this applies before it prunes. Its
    scope is the cluster, as ``add_cdk8s_chart``'s is (the logical ids stay those of the
    manifests it took objects over from)."""
    if not isinstance(cluster, Construct):  # every ICluster is one; jsii types the scope as Construct
        raise TypeError(f"cluster: expected a construct, got {type(cluster).__name__}")
    return eks.KubernetesManifest(
        cluster,
        id,
        cluster=cluster,
        manifest=chart.to_json(),
        overwrite=True,
    )
