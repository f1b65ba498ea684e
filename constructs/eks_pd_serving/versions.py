"""Versions that must move together, in one place.

Each group below is pinned as a unit: bump one member and tests/unit/test_versions.py tells you which
other one has to follow.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Final

# aws-cdk-lib is pinned in requirements.txt; the Kubernetes versions it knows end at 1.36.
AWS_CDK_LIB_VERSION: Final = "2.275.0"


@dataclass(frozen=True)
class KubernetesRelease:
    """One EKS Kubernetes minor version and the kubectl/helm Lambda layer that matches it."""

    version: str
    kubectl_layer_module: str
    kubectl_layer_class: str
    kubectl_layer_package: str


def _release(minor: int) -> KubernetesRelease:
    return KubernetesRelease(
        version=f"1.{minor}",
        kubectl_layer_module=f"aws_cdk.lambda_layer_kubectl_v{minor}",
        kubectl_layer_class=f"KubectlV{minor}Layer",
        kubectl_layer_package=f"aws-cdk.lambda-layer-kubectl-v{minor}",
    )


# Versions EKS still creates on 2026-11-29 and aws-cdk-lib 2.275 knows; each layer package is
# pinned in requirements.txt.
KUBERNETES_RELEASES: Final = {r.version: r for r in map(_release, range(32, 37))}
DEFAULT_KUBERNETES_VERSION: Final = "1.35"

# End of EKS standard support per version (release + 14 months; 1.35 and 1.36 projected from
# their release months). Extended support lasts 12 months more, at the extended price; after it
# EKS no longer creates clusters at that version. The one table of support dates: the config
# rejects retired versions with it, `cost` prices the control plane with it.
EKS_STANDARD_SUPPORT_ENDS: Final = {
    "1.29": datetime.date(2025, 3, 23),
    "1.30": datetime.date(2025, 7, 23),
    "1.31": datetime.date(2025, 11, 26),
    "1.32": datetime.date(2026, 3, 23),
    "1.33": datetime.date(2026, 7, 29),
    "1.34": datetime.date(2026, 12, 2),
    "1.35": datetime.date(2027, 3, 27),
    "1.36": datetime.date(2027, 7, 28),
}


def extended_support_ends(version: str) -> datetime.date:
    standard = EKS_STANDARD_SUPPORT_ENDS[version]
    return standard.replace(year=standard.year + 1)


# EKS no longer creates clusters at these versions (end of extended support, before this release).
RETIRED_KUBERNETES_VERSIONS: Final = {
    version: extended_support_ends(version).isoformat()
    for version in EKS_STANDARD_SUPPORT_ENDS
    if version not in KUBERNETES_RELEASES
}


@dataclass(frozen=True)
class ChartPin:
    """A Helm chart at one version, from one repository."""

    chart: str
    repository: str
    version: str


# KubeRay: the Helm chart and the CRDs it installs are one release; the schema test reads the
# CRDs of exactly this version from ../shared/kuberay/<KUBERAY_VERSION>/.
KUBERAY_CHART: Final = ChartPin("kuberay-operator", "https://ray-project.github.io/kuberay-helm/", "1.7.0")
KUBERAY_VERSION: Final = KUBERAY_CHART.version

# Device plugins. NVIDIA 0.19.0-0.19.2 conflict with the EFA plugin; 0.20.0 does not.
NVIDIA_DEVICE_PLUGIN_CHART: Final = ChartPin(
    "nvidia-device-plugin", "https://nvidia.github.io/k8s-device-plugin", "0.20.0"
)
# eks-charts versions the chart apart from the plugin image: chart v0.5.30 ships image v0.5.20
# (its appVersion; chart v0.5.8 shipped image v0.5.5). Its supportedInstanceLabels list g6.8xlarge.
EKS_CHARTS_REPOSITORY: Final = "https://aws.github.io/eks-charts"
EFA_DEVICE_PLUGIN_CHART: Final = ChartPin("aws-efa-k8s-device-plugin", EKS_CHARTS_REPOSITORY, "v0.5.30")
EFA_DEVICE_PLUGIN_IMAGE_VERSION: Final = "v0.5.20"

# AWS Load Balancer Controller (endpoint_exposure=internal): eks-charts chart 3.5.0 ships
# controller v3.5.0 (its appVersion); policies/ holds that release's docs/install/iam_policy.json
# (kubernetes-sigs/aws-load-balancer-controller tag v3.5.0, commit 5982613953df).
AWS_LOAD_BALANCER_CONTROLLER_CHART: Final = ChartPin("aws-load-balancer-controller", EKS_CHARTS_REPOSITORY, "3.5.0")
AWS_LOAD_BALANCER_CONTROLLER_POLICY: Final = (
    f"policies/aws-load-balancer-controller-v{AWS_LOAD_BALANCER_CONTROLLER_CHART.version}.json"
)
# Cluster Autoscaler (autoscaling=true): its minor must match the cluster's Kubernetes minor. The
# chart (kubernetes/autoscaler tag cluster-autoscaler-chart-9.59.0, appVersion 1.35.0) runs any of
# them; the image is the newest patch of each minor (tags cluster-autoscaler-1.3x.y, 2026-07-22).
# policies/ holds the "Full Cluster Autoscaler Features Policy" of cloudprovider/aws/README.md
# at tag cluster-autoscaler-1.35.2 (commit 2d42588803c7), unchanged.
CLUSTER_AUTOSCALER_CHART: Final = ChartPin("cluster-autoscaler", "https://kubernetes.github.io/autoscaler", "9.59.0")
CLUSTER_AUTOSCALER_IMAGE_TAGS: Final = {
    "1.32": "v1.32.7",
    "1.33": "v1.33.6",
    "1.34": "v1.34.5",
    "1.35": "v1.35.2",
    "1.36": "v1.36.1",
}
CLUSTER_AUTOSCALER_POLICY: Final = "policies/cluster-autoscaler-v1.35.2.json"
# CloudWatch Observability EKS add-on (observability=true). Its versions follow the
# aws-observability/helm-charts chart amazon-cloudwatch-observability (chart 1.5.2 is add-on
# v1.5.2-eksbuild.1 in AWS's docs); the configuration values here follow that chart's values.yaml
# at tag amazon-cloudwatch-observability-6.4.0 (2026-07-21: agent 1.300070.0b1586, operator
# 3.6.0, DCGM exporter 4.6.0-4.8.3, Fluent Bit 3.4.8). Whether EKS offers it for the cluster's
# Kubernetes version, and accepts the values, `preflight` asks EKS (DescribeAddonVersions,
# DescribeAddonConfiguration); nothing here can.
CLOUDWATCH_OBSERVABILITY_CHART_VERSION: Final = "6.4.0"
CLOUDWATCH_OBSERVABILITY_ADDON_VERSION: Final = f"v{CLOUDWATCH_OBSERVABILITY_CHART_VERSION}-eksbuild.1"
# The Ray head's GCS store (gcs_fault_tolerance): ElastiCache for Valkey with cluster mode
# disabled: Ray 2.58's GCS takes a clustered store of one shard at most, and ElastiCache Serverless
# failed over TLS (ray-project/ray#44965). Valkey speaks the Redis protocol Ray's client uses.
GCS_STORE_ENGINE: Final = "valkey"
GCS_STORE_ENGINE_VERSION: Final = "8.0"
GCS_STORE_PORT: Final = 6379
# The head's Ray container takes the store's token from a file (env valueFrom.fileKeyRef): the
# EnvFiles feature, beta and on by default from Kubernetes 1.35 (alpha, off, in 1.34).
ENV_FILES_KUBERNETES_VERSION: Final = "1.35"
# cdk8s-plus is published per Kubernetes minor (cdk8s-plus-35 for 1.35); requirements.txt pins it.
CDK8S_PLUS_PACKAGE: Final = "cdk8s-plus-" + DEFAULT_KUBERNETES_VERSION.split(".")[1]

# The serving image and the Ray version inside it: AWS Ray LLM DLC v1.0 carries Ray 2.58.0,
# vLLM 0.26.0, CUDA 13.0.2, Python 3.13. rayVersion in the RayService must equal RAY_VERSION.
RAY_IMAGE_ACCOUNT: Final = "763104351884"
RAY_IMAGE_REPOSITORY: Final = "ray"
RAY_IMAGE_TAG: Final = "serve-llm-cuda-v1.0"
RAY_VERSION: Final = "2.58.0"
# The image's engine stack as `ray[llm]==RAY_VERSION` pins it (ray's own METADATA): the GPU
# rehearsal installs exactly these (rehearsal/gpu_install.sh reads them from here).
VLLM_VERSION: Final = "0.26.0"
NIXL_VERSION: Final = "1.3.1"
IMAGE_PYTHON_STACK: Final = (
    f"ray[serve,llm]=={RAY_VERSION}",
    f"vllm=={VLLM_VERSION}",
    f"nixl=={NIXL_VERSION}",
    f"nixl-cu13=={NIXL_VERSION}",
)


def ray_image_uri(region: str) -> str:
    """The Ray LLM DLC image in ``region`` (a CloudFormation token is fine)."""
    return f"{RAY_IMAGE_ACCOUNT}.dkr.ecr.{region}.amazonaws.com/{RAY_IMAGE_REPOSITORY}:{RAY_IMAGE_TAG}"
