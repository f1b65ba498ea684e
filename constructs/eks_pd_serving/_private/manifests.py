"""A cdk8s chart applied as a manifest that takes over objects that already exist."""

from __future__ import annotations

from typing import cast

import cdk8s
from aws_cdk import aws_eks_v2 as eks


def adopting_manifest(cluster: eks.Cluster, id: str, chart: cdk8s.Chart) -> eks.KubernetesManifest:
    """``chart`` as a manifest that applies on create (``overwrite``), so an update from a version
    that had its objects in another manifest finds them in place (`kubectl create` would fail on
    them). That other manifest must depend on this one, so this applies before it prunes."""
    return eks.KubernetesManifest(
        cluster,
        id,
        cluster=cast(eks.ICluster, cluster),  # see EksCluster.handle
        manifest=chart.to_json(),
        overwrite=True,
    )
