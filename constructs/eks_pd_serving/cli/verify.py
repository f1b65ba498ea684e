"""After `cdk deploy`, with your kubeconfig: is it serving the way it was designed to?

- every GPU node advertises nvidia.com/gpu and vpc.amazonaws.com/efa;
- the Ray head runs on a system node, and how often its container restarted (each restart,
  without GCS fault tolerance, rebuilt the Ray cluster);
- with gcs_fault_tolerance: the head runs with it (KubeRay's ray.io/ft-enabled on the head pod)
  and its store, found by the head's RAY_REDIS_ADDRESS, is available in ElastiCache, with its
  nodes, the primary's AZ and whether it fails over by itself;
- each served model (the ingress names its phase applications): both applications RUNNING, their
  pair keys equal, prefill and decode replicas on different GPU nodes (Ray dashboard, --dashboard);
- worker logs show `Backend LIBFABRIC was instantiated` and never UCX;
- /v1/models and one streamed chat completion answer, with time to first token (--endpoint);
- with observability: the GPU nodes' EFA byte counters moved in the minutes of that request
  (Container Insights' node_efa_rx_bytes, read from CloudWatch; it arrives a minute or two late,
  so verify waits up to --efa-wait-s): the KV crossed EFA, not only LIBFABRIC was instantiated;
- with pd_failover (and observability): the requests since the test request were served by the
  pair, disaggregated (or, under short_prompt_tokens, on decode alone), none by one engine for the
  other (the failover's path counter, read from CloudWatch as the EFA counters are);
- with api_keys: a request without a key gets 401 and one with the key is served (the key from
  --api-key, or $EKS_PD_API_KEY: the stack's ApiKeyCommand output prints one);
- the serving namespace's NetworkPolicies are in place (the Ray head closed to other pods);
- with endpoint_exposure=internal: the NLB exists and its DNS name (it answers only from inside
  the VPC: run verify there with --endpoint http://<that name>);
- each GPU worker's cold start, split into its parts (information, never a failure): scheduled to
  image pulled (the kubelet's event), container started, the weights (filled from S3 or read from
  the node cache, its own log line), vLLM's weight load and its engine init (their log lines), and
  the pod ready; docs/features/cold-start.md holds the budget they are measured against;
- each engine deployment's last replica start, split into its parts (information): Serve saw the
  fault or change, the replica actor up, the weights made ready on the node, vLLM's engine process
  and its Ray executor worker up, weights loaded, engine initialised, RUNNING (Serve's controller
  log read through the dashboard, the replicas' and engines' lines from the worker pods' logs).

Open the two ports first, as the stack outputs say:
  kubectl -n inference port-forward svc/ray-llm-serve-svc 8000:8000
  kubectl -n inference port-forward svc/ray-llm-head-svc 8265:8265
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import httpx

from .. import rollout
from ..capacity.checks import block_times
from ..config import derived
from ..endpoint_check import EndpointFailed, check_endpoint, check_refused_without_key
from ..k8s.names import LOCK_DOWN_POLICIES, RAY_EGRESS_POLICY, endpoint_service_name
from ..layout import GPU_NODE_LABELS, SYSTEM_NODE_LABELS
from ..observability import CONTAINER_INSIGHTS, EFA_RX_BYTES, LIBFABRIC_LINE, UCX_LINE, replica_start
from ..observability import catalogue as om
from ..phase import PHASES, Phase
from ._common import add_config_arguments, console, load_config, table

LIBFABRIC = LIBFABRIC_LINE
UCX = UCX_LINE
UCX_FIX = (
    "NIXL fell back to UCX, which moves the KV cache at TCP speed. Fix: keep kv_backend=LIBFABRIC, "
    "check the pods request vpc.amazonaws.com/efa and add IPC_LOCK (or gpu_worker_privileged=true), and that "
    "FI_PROVIDER=efa is set"
)


API_KEY_ENV = "EKS_PD_API_KEY"


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: ~/.kube/config)")
    parser.add_argument("--endpoint", default="http://127.0.0.1:8000", help="port-forwarded serve service")
    parser.add_argument("--dashboard", default="http://127.0.0.1:8265", help="port-forwarded Ray dashboard")
    parser.add_argument("--skip-http", action="store_true", help="only the Kubernetes checks")
    parser.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                        help=f"a key of the endpoint, with api_keys (default: ${API_KEY_ENV})")  # fmt: skip
    parser.add_argument("--efa-wait-s", type=float, default=240.0,
                        help="how long to wait for the request's minute of EFA metrics (default 240)")  # fmt: skip
    parser.add_argument(
        "--profile", help="AWS profile for reading CloudWatch and ElastiCache (default: the environment's)"
    )


def _selector(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in labels.items())


def check_nodes(core: Any) -> tuple[list[Check], set[str]]:
    gpu_nodes = core.list_node(label_selector=_selector(GPU_NODE_LABELS)).items
    if not gpu_nodes:
        return [Check("GPU nodes", False, f"no node labelled {_selector(GPU_NODE_LABELS)}")], set()
    checks = []
    for node in gpu_nodes:
        allocatable = node.status.allocatable or {}
        missing = [r for r in ("nvidia.com/gpu", "vpc.amazonaws.com/efa") if int(allocatable.get(r, "0")) < 1]
        detail = "advertises nvidia.com/gpu and vpc.amazonaws.com/efa" if not missing else (
            f"does not advertise {', '.join(missing)}. Fix: check the device plugin pods on this node"
        )  # fmt: skip
        checks.append(Check(f"node {node.metadata.name}", not missing, detail))
    system = {n.metadata.name for n in core.list_node(label_selector=_selector(SYSTEM_NODE_LABELS)).items}
    return checks, system


def worker_log(core: Any, namespace: str, pod: str) -> str:
    """The worker container's log as text, read raw and decoded here: kubernetes-client 36.0.0
    returns a log as the str() of its bytes, ``"b'...'"`` with escaped newlines (its issue #2596)."""
    response = core.read_namespaced_pod_log(pod, namespace, container="ray-worker", _preload_content=False)
    return str(response.data.decode("utf-8", errors="replace"))


def check_pods(
    core: Any, namespace: str, cluster_prefix: str, system_nodes: set[str]
) -> tuple[list[Check], dict[str, str], list[Any], list[tuple[Any, str]]]:
    """Head placement and NIXL backend per worker; returns pod IP -> node for replica placement,
    the head pods (for the GCS fault tolerance check), and each worker pod with its log (read
    once, for the cold start's split too)."""
    pods = [p for p in core.list_namespaced_pod(namespace).items if p.metadata.name.startswith(cluster_prefix)]
    heads = [p for p in pods if (p.metadata.labels or {}).get("ray.io/node-type") == "head"]
    workers = [p for p in pods if (p.metadata.labels or {}).get("ray.io/node-type") == "worker"]
    checks = []
    logs = [(w, worker_log(core, namespace, w.metadata.name)) for w in workers]
    for head in heads:
        on_system = head.spec.node_name in system_nodes
        detail = f"on node {head.spec.node_name}; {head_restarts(head)}"
        checks.append(Check(f"head {head.metadata.name}", on_system, detail))
    if not heads:
        checks.append(Check("Ray head", False, f"no head pod of {cluster_prefix} in {namespace}"))
    for worker, log in logs:
        if UCX in log:
            checks.append(Check(f"NIXL {worker.metadata.name}", False, UCX_FIX))
        elif LIBFABRIC in log:
            checks.append(Check(f"NIXL {worker.metadata.name}", True, LIBFABRIC))
        else:
            checks.append(Check(f"NIXL {worker.metadata.name}", False, "no NIXL backend line in the log yet"))
    if not workers:
        checks.append(Check("Ray workers", False, f"no worker pod of {cluster_prefix} in {namespace}"))
    return checks, {p.status.pod_ip: p.spec.node_name for p in workers if p.status.pod_ip}, heads, logs


# The parts of an engine start, as their programs log them (vLLM 0.26's lines, captured in
# docs/gpu-runs/2026-12-03; the node cache's, weights/node_cache/eks_pd_node_cache.py), each with
# how verify words its last occurrence.
_COLD_START_LINES: dict[str, tuple[re.Pattern[str], str]] = {
    "filled": (
        re.compile(r"node cache: filled \S+ with snapshot \S+ from \S+: \d+ files, ([\d.]+) GiB in ([\d.]+) s"),
        "weights from S3 to the node: {0} GiB in {1} s",
    ),
    "reused": (
        re.compile(r"node cache: (\S+) holds snapshot \S+, no weights read from S3"),
        "weights: the node's copy, none from S3",
    ),
    "loaded": (re.compile(r"Loading weights took ([\d.]+) seconds"), "vLLM loaded them in {0} s"),
    "engine": (
        re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"),
        "engine init {0} s",
    ),
}
_PULLED = re.compile(r'Successfully pulled image "[^"]+" in ([\dhms.]+)')


def _since(start: datetime.datetime | None, end: datetime.datetime | None) -> str:
    return f"{(end - start).total_seconds():.0f} s" if start and end else "?"


def cold_start_split(pod: Any, events: list[Any], log: str) -> Check:
    """One worker pod's last start in its parts, each from where Kubernetes or the program says it:
    the pod's conditions, the kubelet's image event and the engines' log lines (the last of each)."""
    conditions = {c.type: c.last_transition_time for c in (pod.status.conditions or [])}
    statuses = pod.status.container_statuses or []
    running = next((s.state.running for s in statuses if s.state and s.state.running), None)
    started = running.started_at if running else None
    parts = [f"scheduled to started {_since(conditions.get('PodScheduled'), started)}"]
    pulls = [e.message for e in events if e.reason == "Pulled"]
    if pulls:
        took = _PULLED.search(pulls[-1])
        parts.append(f"image pulled in {took.group(1)}" if took else "image already on the node")
    last = {key: list(pattern.finditer(log))[-1:] for key, (pattern, _) in _COLD_START_LINES.items()}
    if last["filled"] and last["reused"]:  # the last start's weights: filled or found on the node
        last["filled" if last["filled"][0].start() < last["reused"][0].start() else "reused"] = []
    for key, (_, wording) in _COLD_START_LINES.items():
        if last[key]:
            parts.append(wording.format(*last[key][0].groups()))
    parts.append(f"started to ready {_since(started, conditions.get('Ready'))}")
    return Check(f"cold start {pod.metadata.name}", True, "; ".join(parts))


def check_cold_start(core: Any, namespace: str, workers: list[tuple[Any, str]]) -> list[Check]:
    """``cold_start_split`` for each worker pod and its log (information: a slow start is no
    failure)."""
    checks = []
    for pod, log in workers:
        name = pod.metadata.name
        events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
        checks.append(cold_start_split(pod, events, log))
    return checks


def serve_log_lines(dashboard: str, node_ip: str) -> list[str]:
    """Serve's controller and replica log files on one Ray node (the head's holds the controller's),
    read through the Ray dashboard's log API (``/api/v0/logs``: what ``ray logs`` reads)."""
    listing = httpx.get(f"{dashboard}/api/v0/logs", params={"node_ip": node_ip, "glob": "serve/*.log"}, timeout=30)
    listing.raise_for_status()
    names = [n for group in (listing.json()["data"]["result"] or {}).values() for n in group]
    lines: list[str] = []
    for name in sorted(n if "/" in n else f"serve/{n}" for n in names):
        if not name.startswith(("serve/controller_", "serve/replica_")) or "controller_build" in name:
            continue
        params = {"node_ip": node_ip, "filename": name, "lines": -1}
        response = httpx.get(f"{dashboard}/api/v0/logs/file", params=params, timeout=60)
        response.raise_for_status()
        lines += response.text.splitlines()
    return lines


def check_replica_starts(lines: list[str]) -> list[Check]:
    """Each engine deployment's last replica start, in its parts (observability/replica_start.py:
    Serve's lines, the node cache's, vLLM's); information, never a failure."""
    last: dict[tuple[str, str], replica_start.ReplicaStart] = {}
    for start in replica_start.engine_starts(lines):
        last[(start.app, start.deployment)] = start
    if not last:
        return [Check("replica start", True, "no engine replica start in Serve's controller log")]
    return [Check(f"replica start {s.phase}", True, s.line()) for _, s in sorted(last.items())]


def head_restarts(head: Any) -> str:
    """The head container's restarts: without GCS fault tolerance each one rebuilt the Ray cluster
    (every engine reloaded; docs/features/failures.md)."""
    statuses = (head.status.container_statuses if head.status else None) or []
    count = sum(s.restart_count or 0 for s in statuses if s.name == "ray-head")
    return f"{count} restart{'' if count == 1 else 's'} of ray-head"


# KubeRay v1.7.0 marks the head pod (common/pod.go, configureGCSFaultTolerance) and sets the store's
# address on the Ray container (configureRedisFT).
FT_ANNOTATION = "ray.io/ft-enabled"
STORE_ADDRESS_ENV = "RAY_REDIS_ADDRESS"


def _store_host(head: Any) -> str | None:
    for container in head.spec.containers or []:
        for env in container.env or []:
            if env.name == STORE_ADDRESS_ENV and env.value:
                return urlparse(env.value if "://" in env.value else f"redis://{env.value}").hostname
    return None


def check_gcs_fault_tolerance(heads: list[Any], on: bool, elasticache: Callable[[], Any]) -> Check:
    """The head runs with GCS fault tolerance and its store is available (``elasticache``: a
    factory for the ElastiCache client, called only when there is a store to look up)."""
    name = "GCS fault tolerance"
    if not on:
        return Check(name, True, "off (gcs_fault_tolerance=false): a head restart rebuilds the Ray cluster")
    if not heads:
        return Check(name, False, "no head pod to ask")
    head = heads[0]
    if (head.metadata.annotations or {}).get(FT_ANNOTATION) != "true":
        return Check(
            name, False, f"the head {head.metadata.name} runs without it ({FT_ANNOTATION} is not true): its "
            "RayCluster predates the setting. Fix: recreate the RayCluster (docs/guides/updates.md)"
        )  # fmt: skip
    host = _store_host(head)
    if host is None:
        return Check(name, False, f"the head {head.metadata.name} has no {STORE_ADDRESS_ENV}")
    import botocore.exceptions

    try:
        pages = elasticache().get_paginator("describe_replication_groups").paginate()
        groups = [g for page in pages for g in page["ReplicationGroups"]]
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as error:
        return Check(
            name,
            False,
            f"ElastiCache unreadable ({error}). Fix: credentials with elasticache:DescribeReplicationGroups",
        )
    for group in groups:
        for node_group in group.get("NodeGroups") or []:
            if (node_group.get("PrimaryEndpoint") or {}).get("Address") != host:
                continue
            members = node_group.get("NodeGroupMembers") or []
            zones = [m.get("PreferredAvailabilityZone", "?") for m in members if m.get("CurrentRole") == "primary"]
            detail = (
                f"store {group['ReplicationGroupId']} {group['Status']}; {len(members)} node(s), primary in "
                f"{zones[0] if zones else 'no AZ reported'}; automatic failover {group.get('AutomaticFailover')}"
            )
            return Check(name, group["Status"] == "available", detail)
    return Check(name, False, f"no ElastiCache replication group has the head's store address {host}")


def check_capacity_blocks(settings: Any, ec2: Callable[[], Any], now: datetime.datetime | None = None) -> list[Check]:
    """Each Capacity Block group's block: when it ends, when the group scales to zero and when the
    warning goes out (``capacity.checks.block_times``, as the schedules have them). Fails once the
    scale-down time has passed (the phase has no nodes until a deploy moves it to another option)."""
    blocks = [g for g in derived.reserved_groups(settings) if g.block]
    if not blocks:
        return []
    import botocore.exceptions

    now = now or datetime.datetime.now(datetime.UTC)
    found = []
    for group in blocks:
        name = f"Capacity Block ({group.name})"
        try:
            (block,) = ec2().describe_capacity_reservations(CapacityReservationIds=[group.target])[
                "CapacityReservations"
            ]
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as error:
            found.append(Check(name, False, f"{group.target} unreadable ({error}). Fix: credentials with "
                               "ec2:DescribeCapacityReservations"))  # fmt: skip
            continue
        end = block["EndDate"]
        scale_down, warn = block_times(end, now)
        if now >= scale_down:
            found.append(Check(name, False, f"{group.target} ends {end.isoformat()}; the {group.name} group was scaled "
                               f"to zero at {scale_down.isoformat()}. Fix: deploy with {group.setting} on another "
                               "option (or buy a new block)"))  # fmt: skip
            continue
        left = scale_down - now
        found.append(Check(name, True, f"{group.target} ends {end.isoformat()}; the {group.name} group scales to zero "
                           f"at {scale_down.isoformat()} (in {left.days} d {left.seconds // 3600} h), warning at "
                           f"{warn.isoformat()}"))  # fmt: skip
    return found


# Who reaches the Ray pods, and whom they reach (a client's request names no host the pods may call).
NETWORK_POLICIES = (*LOCK_DOWN_POLICIES, RAY_EGRESS_POLICY)


def check_network_policies(networking: Any, namespace: str) -> Check:
    found = {p.metadata.name for p in networking.list_namespaced_network_policy(namespace).items}
    missing = [name for name in NETWORK_POLICIES if name not in found]
    detail = (
        f"missing {missing}: the Ray pods are open to every pod, or may connect anywhere. Fix: redeploy the stack"
        if missing
        else (f"{len(NETWORK_POLICIES)} in {namespace}; enforced only with the VPC CNI's enableNetworkPolicy")
    )
    return Check("NetworkPolicies", not missing, detail)


def check_internal_endpoint(core: Any, namespace: str, service: str) -> Check:
    """The NLB the controller made for the endpoint Service: its DNS name, once it exists."""
    try:
        status = core.read_namespaced_service(service, namespace).status
    except Exception as error:  # the client's ApiException, or no such Service
        return Check("internal endpoint", False, f"Service {namespace}/{service} unreadable ({error})")
    ingress = (status.load_balancer.ingress or []) if status and status.load_balancer else []
    hostname = ingress[0].hostname if ingress else None
    if not hostname:
        return Check(
            "internal endpoint",
            False,
            "no NLB address yet: the AWS Load Balancer Controller creates it after deploy "
            f"(kubectl -n kube-system logs deploy/aws-load-balancer-controller; "
            f"kubectl -n {namespace} describe service {service})",
        )
    return Check("internal endpoint", True, f"http://{hostname} (inside the VPC: verify --endpoint http://{hostname})")


def check_api_keys(base_url: str, on: bool, key: str | None) -> Check:
    """With api_keys, ``GET /v1/models`` without a key must get 401 (the endpoint check then sends
    the key); without, it reports that anyone who reaches the endpoint may call it."""
    try:
        status = check_refused_without_key(base_url)
    except httpx.HTTPError as error:
        return Check("API keys", False, f"endpoint unreachable ({error}); port-forward 8000")
    if not on:
        return Check("API keys", True, f"off (api_keys=false): a request without a key got HTTP {status}")
    if status != 401:
        return Check(
            "API keys",
            False,
            f"a request without a key got HTTP {status}, not 401: the running Ray cluster predates the check. Fix: "
            "recreate it (docs/guides/updates.md: kubectl delete raycluster -l ray.io/originated-from-cr-name=<name>)",
        )
    if not key:
        return Check("API keys", False, f"401 without a key; no key to test with. Fix: export {API_KEY_ENV}=<a key>")
    return Check("API keys", True, "401 without a key; the endpoint check below sends the key")


def check_replica_placement(serve_apps: dict[str, Any], pod_nodes: dict[str, str]) -> Check:
    """Ray dashboard /api/serve/applications/: prefill and decode replicas on different nodes."""
    nodes: dict[str, set[str]] = {"Prefill": set(), "Decode": set()}
    for app in serve_apps.get("applications", {}).values():
        for name, deployment in app.get("deployments", {}).items():
            phase = next((p for p in nodes if name.startswith(p)), None)
            if phase is None:
                continue
            for replica in deployment.get("replicas", []):
                ip = str(replica.get("node_ip"))
                nodes[phase].add(pod_nodes.get(ip, f"ip {ip}"))
    if not nodes["Prefill"] or not nodes["Decode"]:
        return Check(
            "replica placement",
            False,
            f"replicas not found: {nodes} (a phase autoscaled to zero has none until a request arrives: "
            "run verify again after one)",
        )
    shared = nodes["Prefill"] & nodes["Decode"]
    detail = f"prefill on {sorted(nodes['Prefill'])}, decode on {sorted(nodes['Decode'])}"
    return Check("replica placement", not shared, detail + (f"; both on {sorted(shared)}" if shared else ""))


# A deployment's statuses that serve: the serve rollout's own (its program's SERVING), one list.
SERVING = rollout.serving_statuses()


def check_served_models(serve_apps: dict[str, Any], pod_nodes: dict[str, str]) -> list[Check]:
    """Ray dashboard /api/serve/applications/, one check per served model (the failover's layout: the
    ingress application's ``models`` name each model's phase applications): both applications
    RUNNING with every deployment serving, the two phases' pair keys equal (else decode refuses
    prefill's KV), and prefill's and decode's replicas on different nodes. Ray's one application (no
    failover): the placement check alone."""
    apps = serve_apps.get("applications", {})
    models = [
        entry
        for app in apps.values()
        for entry in (((app.get("deployed_app_config") or {}).get("args") or {}).get("models") or [])
        if isinstance(entry, dict) and all(phase in entry for phase in PHASES)
    ]
    if not models:
        return [check_replica_placement(serve_apps, pod_nodes)]
    checks = []
    for entry in models:
        problems, nodes, pairs = [], {}, {}
        for phase in PHASES:
            name = entry[phase]["app"]
            app = apps.get(name)
            if app is None:
                problems.append(f"application {name} missing")
                continue
            if app.get("status") != "RUNNING":
                problems.append(f"{name} {app.get('status')}")
            deployment = (app.get("deployments") or {}).get(entry[phase]["deployment"]) or {}
            if deployment.get("status") not in SERVING:
                problems.append(f"{name}'s {entry[phase]['deployment']} {deployment.get('status', 'absent')}")
            replicas = deployment.get("replicas") or []
            nodes[phase] = {pod_nodes.get(str(r.get("node_ip")), f"ip {r.get('node_ip')}") for r in replicas}
            pairs[phase] = ((app.get("deployed_app_config") or {}).get("args") or {}).get("pair")
        if len(pairs) == 2 and pairs[Phase.PREFILL] != pairs[Phase.DECODE]:
            problems.append(
                f"pair keys differ (prefill {pairs[Phase.PREFILL]}, decode {pairs[Phase.DECODE]}): decode refuses "
                "prefill's KV until both serve one config"
            )
        shared = nodes.get(Phase.PREFILL, set()) & nodes.get(Phase.DECODE, set())
        if shared:
            problems.append(f"prefill and decode both on {sorted(shared)}")
        placed = ", ".join(f"{phase} on {sorted(found)}" for phase, found in nodes.items())
        checks.append(Check(f"model {entry.get('model_id')}", not problems, "; ".join(problems) or placed))
    return checks


@dataclass(frozen=True)
class MetricWindow:
    """One cluster's CloudWatch metrics in one-minute sums from the minute of ``sent``, read every
    15 s for at most ``wait_s``."""

    cloudwatch: Any
    cluster_name: str
    sent: datetime.datetime
    wait_s: float
    sleep: Callable[[float], None] = time.sleep

    def poll(
        self, queries: list[dict[str, Any]], judge: Callable[[list[dict[str, Any]]], Check | None], name: str,
        metric: str,
    ) -> Check:  # fmt: skip
        """Read ``queries`` until ``judge`` decides, or fail naming the check and ``metric`` once
        ``wait_s`` passed with no decision."""
        start = self.sent.replace(second=0, microsecond=0)
        waited = 0.0
        while True:
            end = start + datetime.timedelta(minutes=5)
            answer = self.cloudwatch.get_metric_data(MetricDataQueries=queries, StartTime=start, EndTime=end)
            found = judge(answer["MetricDataResults"])
            if found is not None:
                return found
            if waited >= self.wait_s:
                return Check(
                    name,
                    False,
                    f"no {metric} for {self.cluster_name} within {self.wait_s:.0f} s. Fix: check the "
                    "amazon-cloudwatch-observability add-on's pods (kubectl -n amazon-cloudwatch get pods)",
                )
            self.sleep(15.0)
            waited += 15.0

    def minute_sums(self, query_id: str, namespace: str, metric: str, path: str | None = None) -> dict[str, Any]:
        """A GetMetricData query: ``metric``'s one-minute sums on this cluster (and one failover path)."""
        dimensions = [{"Name": "ClusterName", "Value": self.cluster_name}]
        dimensions += [{"Name": "path", "Value": path}] if path else []
        stat = {"Metric": {"Namespace": namespace, "MetricName": metric, "Dimensions": dimensions}, "Period": 60}
        return {"Id": query_id, **({"Label": path} if path else {}), "MetricStat": {**stat, "Stat": "Sum"}}


def check_efa_traffic(window: MetricWindow) -> Check:
    """Bytes the cluster's EFA devices received in the minutes from the test request (Container
    Insights, dimension ClusterName). Passes once a minute at or after it shows bytes; fails when
    those minutes arrived and all show none, or none arrived in the window's wait."""

    def judge(results: list[dict[str, Any]]) -> Check | None:
        (series,) = results
        received = sum(series["Values"])
        if received > 0:
            return Check("KV over EFA", True, f"{received:,.0f} bytes received on EFA since the test request")
        if len(series["Values"]) >= 2:  # the request's minute and the next: it would have shown
            return Check(
                "KV over EFA",
                False,
                f"{EFA_RX_BYTES} stayed at 0 for {len(series['Values'])} minutes after the test request: the KV "
                "cache did not cross EFA. " + UCX_FIX.split(". ", 1)[1],
            )
        return None

    query = window.minute_sums("efa", CONTAINER_INSIGHTS, EFA_RX_BYTES)
    return window.poll([query], judge, "KV over EFA", EFA_RX_BYTES)


# The failover's paths (fault_tolerance/failover: PATHS): served by the pair, or by one engine.
PAIR_PATHS = ("disaggregated", "short_prompt")
FALLBACK_PATHS = {
    "local_prefill": "decode prefilled locally: prefill had no replica, failed or timed out",
    "prefill_whole": "the prefill engine served requests whole: decode had no replica or refused them",
    "refused": "HTTP 503: neither engine could serve",
}


def check_served_paths(window: MetricWindow) -> Check:
    """Requests by the path that served them in the minutes from the test request (the failover's
    counter, dimensions ClusterName and path). Passes once the pair served and no request fell back;
    fails on any fallback, or when no count arrived in the window's wait."""
    paths = (*PAIR_PATHS, *FALLBACK_PATHS)
    queries = [
        window.minute_sums(f"p{index}", om.METRIC_NAMESPACE, om.REQUESTS_BY_PATH, path)
        for index, path in enumerate(paths)
    ]

    def judge(results: list[dict[str, Any]]) -> Check | None:
        counts = {r["Label"]: sum(r["Values"]) for r in results}
        fallen = {path: counts.get(path, 0.0) for path in FALLBACK_PATHS if counts.get(path, 0.0) > 0}
        if fallen:
            detail = "; ".join(f"{path} {n:.0f} ({FALLBACK_PATHS[path]})" for path, n in fallen.items())
            return Check(
                "served by the pair",
                False,
                f"since the test request: {detail}. Fix: find the phase without a healthy replica "
                "(kubectl -n <namespace> get pods; the Ray dashboard's Serve page); the pair serves "
                "disaggregated again by itself once it is back",
            )
        served = {path: counts.get(path, 0.0) for path in PAIR_PATHS if counts.get(path, 0.0) > 0}
        if served:
            return Check(
                "served by the pair",
                True,
                ", ".join(f"{path} {n:.0f}" for path, n in served.items()) + " since the test request",
            )
        return None

    return window.poll(queries, judge, "served by the pair", om.REQUESTS_BY_PATH)


def run(args: argparse.Namespace) -> int:
    from kubernetes import client, config

    settings = load_config(args)
    try:
        config.load_kube_config(config_file=args.kubeconfig)
    except Exception as error:  # the client raises several types for a missing or bad kubeconfig
        console.print(f"verify failed: no usable kubeconfig ({error}). Fix: run the UpdateKubeconfigCommand output")
        return 1
    core = client.CoreV1Api()
    try:
        checks, system_nodes = check_nodes(core)
    except client.ApiException as error:
        if error.status not in (401, 403):
            raise
        console.print(
            f"verify failed: the cluster refused your credentials ({error.status} {error.reason}). Fix: run the "
            "UpdateKubeconfigCommand output, which authenticates as ClusterAdminRoleArn; you need sts:AssumeRole on it"
        )
        return 1
    prefix = f"{settings.ray_service_name}-"
    pod_checks, pod_nodes, heads, worker_logs = check_pods(core, settings.namespace, prefix, system_nodes)
    checks += pod_checks
    checks += check_cold_start(core, settings.namespace, worker_logs)
    checks.append(
        check_gcs_fault_tolerance(heads, settings.gcs_fault_tolerance, lambda: _aws(args, settings, "elasticache"))
    )
    checks.append(check_network_policies(client.NetworkingV1Api(), settings.namespace))
    checks += check_capacity_blocks(settings, lambda: _aws(args, settings, "ec2"))
    if settings.internal_endpoint:
        checks.append(
            check_internal_endpoint(core, settings.namespace, endpoint_service_name(settings.ray_service_name))
        )
    try:
        apps = httpx.get(f"{args.dashboard}/api/serve/applications/", timeout=30).json()
        checks += check_served_models(apps, pod_nodes)
    except httpx.HTTPError as error:
        checks.append(Check("replica placement", False, f"Ray dashboard unreachable ({error}); port-forward 8265"))
    try:  # the controller's lines from the head's files, the replicas' and engines' from the pod logs
        serve_lines = [
            line for h in heads if h.status.pod_ip for line in serve_log_lines(args.dashboard, h.status.pod_ip)
        ]
        checks += check_replica_starts(serve_lines + [line for _, log in worker_logs for line in log.splitlines()])
    except (httpx.HTTPError, KeyError, ValueError) as error:
        checks.append(Check("replica start", True, f"Serve's logs unreadable through the dashboard ({error})"))
    if not args.skip_http:
        checks.append(check_api_keys(args.endpoint, settings.api_keys_on, args.api_key))
        sent = datetime.datetime.now(datetime.UTC)
        try:
            report = check_endpoint(args.endpoint, settings.model_id, api_key=args.api_key)
            checks.append(Check("endpoint", True, f"models {report.models}; TTFT {report.ttft_s * 1000:.0f} ms"))
            if settings.observability:
                checks.append(_cloudwatch_check(args, settings, sent, "KV over EFA", check_efa_traffic))
                if settings.pd_failover:
                    checks.append(_cloudwatch_check(args, settings, sent, "served by the pair", check_served_paths))
        except (EndpointFailed, httpx.HTTPError) as error:
            checks.append(Check("endpoint", False, f"{error}; port-forward 8000"))
    rows = [[c.name, "[green]ok[/green]" if c.passed else "[red]FAIL[/red]", c.detail] for c in checks]
    console.print(table("Verify", ["check", "result", "detail"], rows))
    return 0 if all(c.passed for c in checks) else 1


def _aws(args: argparse.Namespace, settings: Any, service: str) -> Any:
    import boto3

    return boto3.Session(profile_name=args.profile, region_name=settings.region).client(service)


def _cloudwatch_check(
    args: argparse.Namespace, settings: Any, sent: datetime.datetime, name: str, check: Callable[[MetricWindow], Check]
) -> Check:
    """``check`` on the cluster's metrics from ``sent``; one line naming the grant when CloudWatch
    cannot be read."""
    import botocore.exceptions

    try:
        return check(MetricWindow(_aws(args, settings, "cloudwatch"), settings.cluster_name, sent, args.efa_wait_s))
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as error:
        return Check(name, False, f"CloudWatch unreadable ({error}). Fix: credentials with cloudwatch:GetMetricData")
