"""Declared runtime needs: what the controllers and pods the template starts need while
CloudFormation creates and deletes it, beyond what the template itself can say. Each entry names
its source."""

from __future__ import annotations

from typing import Final

from ..observability.catalogue import log_group_names

# Helm releases of controllers that call AWS APIs while Kubernetes objects they own are deleted:
# they need DNS (CoreDNS), credentials (EKS Pod Identity) and their nodes until those objects are
# gone. The load balancer controller deletes the NLB, its target groups and security groups behind
# a Service finalizer, retrying ELBv2/EC2 calls for minutes (aws-load-balancer-controller v3.5.0,
# controllers/service/service_controller.go, cleanupLoadBalancerResources).
AWS_CLEANUP_CONTROLLERS: Final = ("aws-load-balancer-controller",)

# Which Helm release holds the finalizer of an object: (kind, field path, value) -> release.
# The controller adds `service.k8s.aws/resources` to Services of its load balancer class.
FINALIZER_HOLDERS: Final = {
    ("Service", "spec.loadBalancerClass", "service.k8s.aws/nlb"): "aws-load-balancer-controller"
}

# `kubectl apply --prune` without --prune-allowlist (what aws-cdk-lib 2.275's kubectl handler
# runs, custom-resource-handlers/dist/aws-eks-v2/kubectl-handler/apply) prunes only these kinds
# (k8s.io/kubectl/pkg/util/prune/prune.go, the default list).
PRUNED_KINDS: Final = frozenset(
    {
        "ConfigMap", "Endpoints", "Namespace", "PersistentVolumeClaim", "PersistentVolume", "Pod",
        "ReplicationController", "Secret", "Service", "Job", "CronJob", "Ingress", "DaemonSet",
        "Deployment", "ReplicaSet", "StatefulSet",
    }
)  # fmt: skip

# CPU requests (millicores) of pods the template does not spell out, per node they run on.
# Sources: the pinned charts' values (KubeRay v1.7.0 values.yaml `resources`, whose limits are the
# requests when none are set; amazon-cloudwatch-observability 6.4.0 values.yaml: agent 250m,
# fluent-bit 50m, manager 100m; aws-load-balancer-controller 3.5.0 sets none). EKS's own
# add-ons (CoreDNS 2 x 100m, kube-proxy 100m, aws-node 25m) are the requests EKS deploys them
# with as documented by EKS, not read from a pinned file here: an estimate.
HELM_DEFAULT_CPU_M: Final = {"kuberay-operator": 100, "aws-load-balancer-controller": 0}
# The Helm releases the stack installs that run a Deployment (not a DaemonSet): each must be
# placed on purpose, or it may land on an autoscaled GPU node.
DEPLOYMENT_RELEASES: Final = ("kuberay-operator", "aws-load-balancer-controller", "cluster-autoscaler")
CLOUDWATCH_MANAGER_CPU_M: Final = 100
CLOUDWATCH_AGENT_CPU_M: Final = 250
CLOUDWATCH_DAEMONSET_CPU_M: Final = 250 + 50  # node agent and Fluent Bit, on every node
EKS_ADDON_CPU_M: Final = {"coredns": 200, "kube-proxy": 100, "vpc-cni": 25}
# The Ray autoscaler sidecar KubeRay adds when the cluster config gives no resources for it
# (KubeRay v1.7.0 ray-operator/controllers/ray/common/pod.go, BuildAutoscalerContainer: 500m).
RAY_AUTOSCALER_DEFAULT_CPU_M: Final = 500


def allocatable_cpu_m(vcpus: int) -> int:
    """Allocatable CPU of an EKS node: the vCPUs less kubelet's reservation as the EKS AMIs
    compute it (6% of the first core, 1% of the second, 0.5% of the next two, 0.25% above;
    awslabs/amazon-eks-ami, nodeadm/internal/kubelet/config.go, getCPUMillicoresToReserve)."""
    reserved = 0.0
    for core in range(vcpus):
        reserved += 60 if core == 0 else 10 if core == 1 else 5 if core < 4 else 2.5
    return int(vcpus * 1000 - reserved)


# Replicas when the values set none (aws-load-balancer-controller 3.5.0 values.yaml: 2).
HELM_DEFAULT_REPLICAS: Final = {"aws-load-balancer-controller": 2}


def control_plane_log_group_name(cluster_name: str) -> str:
    """Where EKS writes the control-plane logs (fixed by EKS)."""
    return f"/aws/eks/{cluster_name}/cluster"


def named_log_groups(cluster_name: str, *, observability: bool) -> list[str]:
    """The log groups the stack creates under names AWS fixes: CloudFormation cannot create one
    that already exists (an earlier Container Insights setup, a cluster of the same name), so
    ``preflight`` looks for each before the first deploy."""
    return [
        control_plane_log_group_name(cluster_name),
        *(log_group_names(cluster_name).values() if observability else []),
    ]
