"""Who may reach the Ray pods, and the endpoint applications in the VPC call (cdk8s-plus-35).

``ServingNetworkChart`` (every exposure): default-deny ingress in the serving namespace; the Ray
pods reach each other on every port (GCS, raylets, object transfer, NIXL side channels); the
KubeRay operator reaches the dashboard (it reads Serve's status there) and the serve port (it
probes the head's proxy at /-/healthz to set ``ray.io/serve``, which the Services select on); the
serve port is open to the namespace and to the client CIDRs; with observability, the metrics port (8080) is
open to the CloudWatch agents' namespace (its Ray scraper runs off the host network there), in
``MetricsAccessChart``, a manifest of its own. Nothing else
reaches GCS (6379), the dashboard and job API (8265), the Ray client (10001) or the metrics port.

With ``limit_egress``, the Ray pods' own connections are limited too (``RAY_EGRESS_POLICY``): to
other Ray pods (any port), DNS in kube-system, the EKS Pod Identity agent, HTTPS (AWS's endpoints,
the API server for the autoscaler, S3 through the gateway endpoint) and the GCS store's port, inside
the VPC alone where its CIDR is known. Nothing else: no kubelet, no other service in the VPC, no
instance metadata, whatever a request names (the failover refuses a client's KV parameters; this
is the second wall). EFA traffic bypasses the kernel and no NetworkPolicy sees it.

``EndpointServiceChart`` (``internal`` exposure): a LoadBalancer Service the AWS Load Balancer
Controller turns into an internal NLB with IP targets on the Ray head's serve port.
"""

from __future__ import annotations

from dataclasses import dataclass

import cdk8s
import cdk8s_plus_35 as kplus
from constructs import Construct

from .names import DEFAULT_DENY_POLICY, OPERATOR_POLICY, RAY_CLUSTER_POLICY, RAY_EGRESS_POLICY, SERVE_POLICY
from .specs import DASHBOARD_PORT, SERVE_PORT

# KubeRay labels every Ray pod it creates with these (ray-operator/controllers/ray/utils/constant.go).
RAY_NODE_LABELS = {"ray.io/is-ray-node": "yes"}
RAY_HEAD_LABELS = {**RAY_NODE_LABELS, "ray.io/node-type": "head"}
# The head, once KubeRay has found its Serve proxy healthy (``ray.io/serve`` is "false" until then).
SERVING_HEAD_LABELS = {"ray.io/node-type": "head", "ray.io/serve": "true"}
# The AWS Load Balancer Controller's own class: only this Service depends on the controller.
NLB_CLASS = "service.k8s.aws/nlb"
ENDPOINT_PORT = 80
TLS_ENDPOINT_PORT = 443
# TLS 1.3 and 1.2 only (the controller's default, ELBSecurityPolicy-2016-08, admits TLS 1.0).
TLS_POLICY = "ELBSecurityPolicy-TLS13-1-2-2021-06"
METRICS_POLICY = "ray-metrics-from-scraper"
# The EKS Pod Identity agent's link-local address on every node (IPv4), and its port.
POD_IDENTITY_AGENT_CIDR = "169.254.170.23/32"
POD_IDENTITY_AGENT_PORT = 80
HTTPS_PORT = 443
DNS_PORT = 53


@dataclass(frozen=True)
class ServingNetworkProps:
    #: The serving namespace (created with the RayService).
    namespace: str
    #: The namespace the KubeRay operator runs in.
    operator_namespace: str
    #: IPv4 CIDRs that may call the serve port from outside the cluster: with an internal NLB, its
    #: subnets' CIDRs (the NLB's own addresses are the sources; it admits the clients itself, by
    #: ``EndpointServiceProps.client_cidrs``).
    nlb_subnet_cidrs: tuple[str, ...]
    #: The namespace whose pods may scrape the Ray pods' metrics port. Default: none may.
    metrics_scraper_namespace: str | None = None
    #: The Ray pods' metrics port (KubeRay's default).
    metrics_port: int = 8080
    #: Limit the Ray pods' egress (``RAY_EGRESS_POLICY``). Default: False (unlimited).
    limit_egress: bool = False
    #: The VPC's IPv4 CIDR: the GCS store's port is reached inside it alone. Default: None (any address).
    vpc_cidr: str | None = None
    #: The GCS store's port, open for egress. Default: None (no store).
    gcs_store_port: int | None = None


@dataclass(frozen=True)
class EndpointServiceProps:
    name: str
    namespace: str
    #: Subnets for the NLB (private, one per AZ): explicit, so no subnet tag discovery is needed.
    subnet_ids: tuple[str, ...]
    #: IPv4 CIDRs allowed through the NLB's security group.
    client_cidrs: tuple[str, ...]
    #: An ACM certificate: the NLB ends TLS on 443 and has no plain-HTTP listener. Default: HTTP on 80.
    tls_certificate_arn: str | None = None
    #: A bucket and prefix for the NLB's access logs (of its TLS listener: an NLB logs no other).
    #: Default: none.
    access_logs: tuple[str, str] | None = None


def _tcp(port: int) -> kplus.NetworkPolicyPort:
    return kplus.NetworkPolicyPort.tcp(port)


class ServingNetworkChart(cdk8s.Chart):
    def __init__(self, scope: Construct, id: str, *, props: ServingNetworkProps) -> None:
        super().__init__(scope, id, disable_resource_name_hashes=True, namespace=props.namespace)
        serving = kplus.Namespaces.select(self, "Serving", names=[props.namespace])
        ray_pods = kplus.Pods.select(self, "RayPods", labels=RAY_NODE_LABELS, namespaces=serving)
        any_pod_here = kplus.Pods.all(self, "AllPods", namespaces=serving)
        operator = kplus.Namespaces.select(self, "OperatorNamespace", names=[props.operator_namespace])

        kplus.NetworkPolicy(
            self,
            "DefaultDeny",
            metadata=cdk8s.ApiObjectMetadata(name=DEFAULT_DENY_POLICY),
            selector=any_pod_here,
            ingress=kplus.NetworkPolicyTraffic(default=kplus.NetworkPolicyTrafficDefault.DENY),
        )
        cluster = kplus.NetworkPolicy(
            self, "RayCluster", metadata=cdk8s.ApiObjectMetadata(name=RAY_CLUSTER_POLICY), selector=ray_pods
        )
        cluster.add_ingress_rule(ray_pods)
        from_operator = kplus.NetworkPolicy(
            self, "Operator", metadata=cdk8s.ApiObjectMetadata(name=OPERATOR_POLICY), selector=ray_pods
        )
        # KubeRay v1.7: the dashboard client (Serve status) and RayHttpProxyClient (proxy health).
        from_operator.add_ingress_rule(operator, [_tcp(DASHBOARD_PORT), _tcp(SERVE_PORT)])
        # Clients reach the serve port on the head alone, the NLB's only target (and, with the API
        # key check, the pod whose proxy checks them first); the workers' proxies serve the cluster.
        head = kplus.Pods.select(self, "RayHead", labels=RAY_HEAD_LABELS, namespaces=serving)
        serve = kplus.NetworkPolicy(self, "Serve", metadata=cdk8s.ApiObjectMetadata(name=SERVE_POLICY), selector=head)
        serve.add_ingress_rule(any_pod_here, [_tcp(SERVE_PORT)])
        for index, cidr in enumerate(props.nlb_subnet_cidrs):
            serve.add_ingress_rule(kplus.NetworkPolicyIpBlock.ipv4(self, f"Client{index}", cidr), [_tcp(SERVE_PORT)])
        if props.limit_egress:
            self._egress(props, ray_pods)

    def _egress(self, props: ServingNetworkProps, ray_pods: kplus.Pods) -> None:
        egress = kplus.NetworkPolicy(
            self, "RayEgress", metadata=cdk8s.ApiObjectMetadata(name=RAY_EGRESS_POLICY), selector=ray_pods
        )
        egress.add_egress_rule(ray_pods)
        system = kplus.Namespaces.select(self, "KubeSystem", names=["kube-system"])
        egress.add_egress_rule(system, [kplus.NetworkPolicyPort.udp(DNS_PORT), _tcp(DNS_PORT)])
        agent = kplus.NetworkPolicyIpBlock.ipv4(self, "PodIdentityAgent", POD_IDENTITY_AGENT_CIDR)
        egress.add_egress_rule(agent, [_tcp(POD_IDENTITY_AGENT_PORT)])
        anywhere = kplus.NetworkPolicyIpBlock.any_ipv4(self, "Anywhere")
        egress.add_egress_rule(anywhere, [_tcp(HTTPS_PORT)])
        if props.gcs_store_port is not None:
            store = kplus.NetworkPolicyIpBlock.ipv4(self, "Vpc", props.vpc_cidr) if props.vpc_cidr else anywhere
            egress.add_egress_rule(store, [_tcp(props.gcs_store_port)])


class MetricsAccessChart(cdk8s.Chart):
    """The metrics port open to the scraper's namespace: a chart of its own (one manifest
    resource), so switching the scraper off deletes the policy. Inside a manifest that stays, a
    NetworkPolicy that leaves it would stay in the cluster: kubectl's default prune list has no
    NetworkPolicy."""

    def __init__(self, scope: Construct, id: str, *, props: ServingNetworkProps) -> None:
        super().__init__(scope, id, disable_resource_name_hashes=True, namespace=props.namespace)
        if not props.metrics_scraper_namespace:
            raise ValueError("MetricsAccessChart needs props.metrics_scraper_namespace")
        serving = kplus.Namespaces.select(self, "Serving", names=[props.namespace])
        ray_pods = kplus.Pods.select(self, "RayPods", labels=RAY_NODE_LABELS, namespaces=serving)
        scraper = kplus.Namespaces.select(self, "ScraperNamespace", names=[props.metrics_scraper_namespace])
        metrics = kplus.NetworkPolicy(
            self, "Metrics", metadata=cdk8s.ApiObjectMetadata(name=METRICS_POLICY), selector=ray_pods
        )
        metrics.add_ingress_rule(scraper, [_tcp(props.metrics_port)])


class EndpointServiceChart(cdk8s.Chart):
    def __init__(self, scope: Construct, id: str, *, props: EndpointServiceProps) -> None:
        super().__init__(scope, id, disable_resource_name_hashes=True, namespace=props.namespace)
        annotations = {
            "service.beta.kubernetes.io/aws-load-balancer-scheme": "internal",
            "service.beta.kubernetes.io/aws-load-balancer-nlb-target-type": "ip",
            "service.beta.kubernetes.io/aws-load-balancer-subnets": ",".join(props.subnet_ids),
            # Explicit (it is the default for IP targets): the pods then see the NLB's own VPC
            # addresses, which is what ServingNetworkChart's serve-port policy admits.
            "service.beta.kubernetes.io/aws-load-balancer-target-group-attributes": "preserve_client_ip.enabled=false",
        }
        port = kplus.ServicePort(name="http", port=ENDPOINT_PORT, target_port=SERVE_PORT)
        if props.tls_certificate_arn:
            # The NLB decrypts; it reaches the pods in plain HTTP inside the VPC, as without TLS.
            annotations.update(
                {
                    "service.beta.kubernetes.io/aws-load-balancer-ssl-cert": props.tls_certificate_arn,
                    "service.beta.kubernetes.io/aws-load-balancer-ssl-ports": "https",
                    "service.beta.kubernetes.io/aws-load-balancer-ssl-negotiation-policy": TLS_POLICY,
                }
            )
            port = kplus.ServicePort(name="https", port=TLS_ENDPOINT_PORT, target_port=SERVE_PORT)
        if props.access_logs:
            if not props.tls_certificate_arn:
                raise ValueError("EndpointServiceProps.access_logs needs tls_certificate_arn: an NLB logs TLS only")
            bucket, prefix = props.access_logs
            # The controller sets them as the NLB's attributes (ModifyLoadBalancerAttributes, in its policy).
            annotations["service.beta.kubernetes.io/aws-load-balancer-attributes"] = (
                f"access_logs.s3.enabled=true,access_logs.s3.bucket={bucket},access_logs.s3.prefix={prefix}"
            )
        service = kplus.Service(
            self,
            "Endpoint",
            metadata=cdk8s.ApiObjectMetadata(name=props.name, annotations=annotations),
            type=kplus.ServiceType.LOAD_BALANCER,
            ports=[port],
            load_balancer_source_ranges=list(props.client_cidrs),
        )
        for key, value in {**RAY_NODE_LABELS, **SERVING_HEAD_LABELS}.items():
            service.select_label(key, value)
        # Not expressible in cdk8s-plus: the class routes this Service to the controller alone.
        cdk8s.ApiObject.of(service).add_json_patch(cdk8s.JsonPatch.add("/spec/loadBalancerClass", NLB_CLASS))
