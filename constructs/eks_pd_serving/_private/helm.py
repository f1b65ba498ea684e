"""The one way this package installs a Helm chart: release and namespace explicit (a renamed
construct never renames what is deployed), wait for the pods, within the handler's 15 minutes."""

from __future__ import annotations

from typing import Any

from aws_cdk import Duration
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from ..versions import ChartPin

TIMEOUT = Duration.minutes(10)


def helm_chart(
    scope: Construct,
    id: str,
    *,
    cluster: eks.ICluster,
    pin: ChartPin,
    release: str,
    namespace: str,
    values: dict[str, Any],
    create_namespace: bool = False,
) -> eks.HelmChart:
    return eks.HelmChart(
        scope,
        id,
        cluster=cluster,
        chart=pin.chart,
        repository=pin.repository,
        version=pin.version,
        release=release,
        namespace=namespace,
        values=values,
        wait=True,
        timeout=TIMEOUT,
        create_namespace=create_namespace or None,  # unset rather than false: the template stays as it was
    )
