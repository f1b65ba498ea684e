"""The rollout Job (pod-side): brings the running Ray cluster onto the RayService's cluster config
inside ``cdk deploy`` (and inside its rollback), and waits, bounded, until it serves again.

KubeRay 1.7 under ``upgradeStrategy: None`` never rebuilds a RayCluster for a changed
``rayClusterConfig`` (``shouldPrepareNewCluster`` in ``rayservice_controller.go`` is false for any
type but the NewCluster ones), and pushes no change of worker replicas or bounds either (its hash
leaves them out). When the active RayCluster is gone, though, it builds a pending one from the
current spec, submits the serve config to it and points the Services at it once every Serve
application is RUNNING. So this program, made by the stack for one config digest (the RayService's
annotation ``DIGEST_ANNOTATION``, which KubeRay copies onto each RayCluster it creates) and one set
of worker bounds (``EKS_PD_ROLLOUT_BOUNDS``):

- waits until the RayService carries the digest (a rollback may apply this Job before it), then
  deletes every RayCluster of it whose digest is another (built from another spec), and waits until
  the RayService's active cluster has the digest and every application is RUNNING;
- patches, in place, the worker groups' replicas, minReplicas and maxReplicas to its bounds (no
  restart);
- exits 0 at once when nothing is stale (a first deploy: no cluster, or one built from this spec).

It fails (exit 1) with one line naming what did not come up when ``EKS_PD_ROLLOUT_DEADLINE_S``
passes; the line is also the pod's termination message. The deploy waits on it in steps that each
fit the kubectl handler's Lambda (15 minutes): so it marks its own Job, by annotation, when it
starts (``STARTED``) and as each ``EKS_PD_ROLLOUT_WINDOW_S`` of its deadline passes (``WINDOW``
and the window's number), and at success every window at once. A call the API server does not
answer (429, 5xx, a timeout or a dropped connection: about 150 calls a rollout) is tried again with
backoff inside the deadline, and a DELETE of a RayCluster already gone counts as done. Standard
library only (the Ray image's Python), the pod's service account token for the Kubernetes API.

In ``serve`` mode (``EKS_PD_ROLLOUT_MODE``), made by the stack for one serve config
(``EKS_PD_ROLLOUT_SERVE_CONFIG``, the RayService's ``serveConfigV2`` as the template holds it) and
applied before the RayService, it rolls a change of the Serve applications one application at a
time (``rollout_steps``: every prefill, every decode, then the ingress), so Serve never restarts two
together and the failover always has a phase standing: for each step it patches the RayService's
``serveConfigV2`` (KubeRay submits it) and waits, bounded by ``EKS_PD_ROLLOUT_STEP_S``, until KubeRay
has seen the patch and reports the step's application RUNNING with every deployment serving (healthy
or in a scale event: ``SERVING``),
``SETTLE_S`` after the patch and on two reads in a row. No RayService yet (a first deploy), or
nothing changed: exit 0 at once. The RayService's manifest, applied next, then holds the same text
(PyYAML reads the running config: the Ray image has it).
"""

from __future__ import annotations

import json
import math
import os
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

DIGEST_ANNOTATION = "eks-pd.io/cluster-config"
ORIGIN_LABEL = "ray.io/originated-from-cr-name"  # KubeRay's, on each RayCluster of a RayService
BOUNDS = ("replicas", "minReplicas", "maxReplicas")
ENV = {
    "service": "EKS_PD_ROLLOUT_RAY_SERVICE",
    "namespace": "EKS_PD_ROLLOUT_NAMESPACE",
    "digest": "EKS_PD_ROLLOUT_DIGEST",
    "deadline": "EKS_PD_ROLLOUT_DEADLINE_S",
    # JSON: each worker group's replicas and bounds, by group name.
    "bounds": "EKS_PD_ROLLOUT_BOUNDS",
    "window": "EKS_PD_ROLLOUT_WINDOW_S",
    # Its own Job's name (the Downward API, from the Job controller's label on its pods).
    "job": "EKS_PD_ROLLOUT_JOB",
    # cluster (the default: rebuild the Ray cluster) or serve (roll the Serve applications).
    "mode": "EKS_PD_ROLLOUT_MODE",
    "serve_config": "EKS_PD_ROLLOUT_SERVE_CONFIG",
    "step": "EKS_PD_ROLLOUT_STEP_S",
    # JSON: the pod annotations of the code the serve config imports, and their digests.
    "code": "EKS_PD_ROLLOUT_CODE",
}
MODES = ("cluster", "serve")
# A deployment's statuses that serve: Serve 2.58 reports an application RUNNING while its deployments
# are "healthy or autoscaling" (UPSCALING, DOWNSCALING).
SERVING = frozenset({"HEALTHY", "UPSCALING", "DOWNSCALING"})
# After a patch, how long before a RUNNING read counts (KubeRay submits on its next reconcile,
# within seconds of a spec change; Serve marks a rebuilt application DEPLOYING when it takes it).
SETTLE_S = 15.0
STEP_LINE = "rollout: serve config step"
ROLLED_LINE = "rollout: serve config applied"
UNCHANGED_LINE = "rollout: serve config unchanged"
NO_SERVICE_LINE = "rollout: no RayService yet"
NEW_CODE_LINE = "rollout: the pods' code or the cluster changes with this deploy"
# The Job controller's label on a Job's pods naming the Job (Kubernetes 1.27+): the pod's env reads
# its Job's name from it.
POD_JOB_LABEL = "batch.kubernetes.io/job-name"
# The annotations on its own Job that the deploy's waits read.
STARTED = "eks-pd.io/rollout-started"
WINDOW = "eks-pd.io/rollout-window-"
NOTHING_LINE = "rollout: nothing to rebuild"
DELETED_LINE = "rollout: deleted RayCluster"
SERVING_LINE = "rollout: serving from RayCluster"
FAILED_LINE = "rollout failed"
ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
TERMINATION_LOG = "/dev/termination-log"
# The API server's answers that say "not now" (throttled, overloaded, a restart behind its load
# balancer): tried again, from RETRY_FIRST_S doubling up to RETRY_MAX_S, until the Api's ``until``.
TRANSIENT_CODES = (429, 500, 502, 503, 504)
RETRY_FIRST_S, RETRY_MAX_S = 1.0, 30.0
# How long a call is tried again when no deadline was set (``converge`` sets its own).
RETRY_BUDGET_S = 120.0
RETRY_LINE = "rollout: the API server did not answer"


def transient(error: BaseException) -> str | None:
    """Why ``error`` is worth another try (the server's or the network's, not the request's), or None."""
    if isinstance(error, urllib.error.HTTPError):
        return f"HTTP {error.code}" if error.code in TRANSIENT_CODES else None
    if isinstance(error, (urllib.error.URLError, TimeoutError, ConnectionError)):
        return f"{type(error).__name__}: {getattr(error, 'reason', error)}"
    return None


class Api:
    """The Kubernetes API as the pod's service account reaches it (``base`` and no TLS context: a
    test's server)."""

    def __init__(self, base: str | None = None, token: str | None = None) -> None:
        self.base = base or f"https://{os.environ['KUBERNETES_SERVICE_HOST']}:{os.environ['KUBERNETES_SERVICE_PORT']}"
        if token is None:
            with open(f"{ACCOUNT}/token") as file:
                token = file.read().strip()
        self.token = token
        self.context = None if base else ssl.create_default_context(cafile=f"{ACCOUNT}/ca.crt")
        #: The monotonic time after which a failed call is no longer tried again, and the first wait.
        self.until = time.monotonic() + RETRY_BUDGET_S
        self.retry_first_s = RETRY_FIRST_S

    def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        """One API call, tried again on a transient failure (``transient``) until ``until``."""
        delay = self.retry_first_s
        while True:
            try:
                return self._once(method, path, body, content_type)
            except Exception as error:
                why = transient(error)
                if why is None or time.monotonic() + delay > self.until:
                    raise
                print(f"{RETRY_LINE} ({method} {path.split('?')[0]}: {why}); again in {delay:.0f} s", flush=True)
                time.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)

    def _once(self, method: str, path: str, body: Any, content_type: str) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Content-Type", content_type)
        with urllib.request.urlopen(request, timeout=30, context=self.context) as answer:
            return json.loads(answer.read() or b"{}")


def digest_of(cluster: dict[str, Any]) -> str | None:
    return ((cluster.get("metadata") or {}).get("annotations") or {}).get(DIGEST_ANNOTATION)


def bound_patches(cluster: dict[str, Any], groups: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """JSON patch ops that give ``cluster``'s worker groups the replicas and bounds in ``groups``
    (this Job's ``EKS_PD_ROLLOUT_BOUNDS``), matched by group name."""
    ops = []
    for index, group in enumerate((cluster.get("spec") or {}).get("workerGroupSpecs") or []):
        target: dict[str, Any] = groups.get(group.get("groupName")) or {}
        for field in BOUNDS:
            if field in target and group.get(field) != target[field]:
                ops.append({"op": "add", "path": f"/spec/workerGroupSpecs/{index}/{field}", "value": target[field]})
    return ops


def serving(service: dict[str, Any], clusters: list[dict[str, Any]], digest: str) -> tuple[bool, str]:
    """Whether the RayService serves from a cluster with ``digest``; else what is missing."""
    status = service.get("status") or {}
    active = (status.get("activeServiceStatus") or {}).get("rayClusterName")
    by_name = {c["metadata"]["name"]: c for c in clusters}
    wanted = [name for name, c in by_name.items() if digest_of(c) == digest]
    if not wanted:
        return False, "KubeRay has not created a RayCluster from the new spec yet"
    if active not in wanted:
        pending = status.get("pendingServiceStatus") or {}
        apps = pending.get("applicationStatuses") or {}
        shown = ", ".join(f"{a} {s.get('status')}" for a, s in sorted(apps.items())) or "no Serve application yet"
        return False, f"RayCluster {pending.get('rayClusterName') or wanted[0]} is not serving ({shown})"
    apps = (status.get("activeServiceStatus") or {}).get("applicationStatuses") or {}
    waiting = [f"{a} {s.get('status')}" for a, s in sorted(apps.items()) if s.get("status") != "RUNNING"]
    if not apps or waiting:
        return False, f"RayCluster {active}: {', '.join(waiting) or 'no Serve application yet'}"
    return True, str(active)


class Progress:
    """What the deploy's waits read on the Job (``job``'s own annotations): started, each window of
    the deadline passed, done; and a failure's line, also the pod's termination message."""

    def __init__(self, api: Api, namespace: str, job: str, deadline_s: float, window_s: float | None) -> None:
        self.api, self.path, self.job = api, f"/apis/batch/v1/namespaces/{namespace}/jobs/{job}", job
        self.window_s = window_s or deadline_s
        self.windows = max(1, math.ceil(deadline_s / self.window_s))
        self.started = time.monotonic()
        self.marked = 0

    def mark(self, annotations: dict[str, str]) -> None:
        if self.job and annotations:
            self.api.call(
                "PATCH", self.path, {"metadata": {"annotations": annotations}}, "application/merge-patch+json"
            )

    def start(self) -> None:
        self.mark({STARTED: "true"})

    def tick(self) -> None:
        """Mark each window that has passed since the start (never the last: ``done`` or a failure ends it)."""
        passed = min(self.windows - 1, int((time.monotonic() - self.started) // self.window_s))
        if passed > self.marked:
            self.mark({f"{WINDOW}{k}": "passed" for k in range(self.marked + 1, passed + 1)})
            self.marked = passed

    def done(self) -> None:
        self.mark({f"{WINDOW}{k}": "done" for k in range(1, self.windows)})

    @staticmethod
    def failed(line: str) -> int:
        print(line, file=sys.stderr, flush=True)
        try:
            with open(TERMINATION_LOG, "w") as log:
                log.write(line)
        except OSError:
            pass
        return 1


def converge(
    api: Api,
    namespace: str,
    name: str,
    digest: str,
    deadline_s: float,
    bounds: dict[str, dict[str, Any]] | None = None,
    window_s: float | None = None,
    job: str = "",
    poll_s: float = 10.0,
) -> int:
    base = f"/apis/ray.io/v1/namespaces/{namespace}"
    selector = urllib.parse.quote(f"{ORIGIN_LABEL}={name}", safe="")
    bounds = bounds or {}
    api.until = time.monotonic() + deadline_s
    progress = Progress(api, namespace, job, deadline_s, window_s)
    progress.start()

    def clusters() -> list[dict[str, Any]]:
        return list(api.call("GET", f"{base}/rayclusters?labelSelector={selector}").get("items") or [])

    def set_bounds(found: list[dict[str, Any]]) -> None:
        for cluster in found:
            ops = bound_patches(cluster, bounds)
            if ops:
                api.call("PATCH", f"{base}/rayclusters/{cluster['metadata']['name']}", ops,
                         "application/json-patch+json")  # fmt: skip
                print(f"rollout: worker bounds of RayCluster {cluster['metadata']['name']} set in place: {ops}")

    end = time.monotonic() + deadline_s
    why, deleted = "", False
    while True:
        service = api.call("GET", f"{base}/rayservices/{name}")
        found = clusters()
        if digest_of(service) != digest:
            # Applied before its RayService (a rollback's order): the stale cluster is the spec's.
            why = f"the RayService has config {digest_of(service)}, not yet {digest}"
        else:
            stale = [c for c in found if digest_of(c) != digest]
            if not stale and not deleted:
                set_bounds(found)
                progress.done()
                print(f"{NOTHING_LINE}: every RayCluster of {name} has config {digest}", flush=True)
                return 0
            for cluster in stale:
                if (cluster.get("metadata") or {}).get("deletionTimestamp"):
                    continue  # already going
                cluster_name = cluster["metadata"]["name"]
                try:
                    api.call("DELETE", f"{base}/rayclusters/{cluster_name}", {"propagationPolicy": "Background"})
                except urllib.error.HTTPError as error:
                    if error.code != 404:  # gone already (a retried DELETE whose first answer was lost)
                        raise
                print(
                    f"{DELETED_LINE} {cluster_name} (config {digest_of(cluster)}, the spec's is {digest})", flush=True
                )
                deleted = True
            deleted = deleted or bool(stale)
            ok, why = serving(service, found, digest)
            if ok:
                set_bounds([c for c in found if digest_of(c) == digest])
                progress.done()
                print(f"{SERVING_LINE} {why} with config {digest}", flush=True)
                return 0
        if time.monotonic() >= end:
            break
        progress.tick()
        print(f"rollout: waiting: {why}", flush=True)
        time.sleep(poll_s)
    return Progress.failed(f"{FAILED_LINE}: {name} did not serve on config {digest} within {deadline_s:.0f} s: {why}")


def rollout_steps(current: dict[str, Any], target: dict[str, Any]) -> list[dict[str, Any]]:
    """The serve configs a change goes through so that no two applications change in one step
    (Serve restarts them together): from ``current``, each changed application of ``target`` in
    its order, one a step, the last step ``target`` itself. A change of the layout (applications
    added, removed or built by another import path) is one step: the old applications hold the GPUs
    the new ones need. (The package's ``k8s.serve_config.rollout_steps``, which the rehearsals run;
    a test holds the two alike.)"""
    live = {app["name"]: app for app in current.get("applications") or []}
    names = [app["name"] for app in target["applications"]]
    if set(live) != set(names) or any(
        live[a["name"]]["import_path"] != a["import_path"] for a in target["applications"]
    ):
        return [target]
    state = dict(live)
    steps = []
    for app in target["applications"]:
        if live[app["name"]] != app:
            state[app["name"]] = app
            steps.append({**target, "applications": [state[name] for name in names]})
    return steps


def step_serving(service: dict[str, Any], apps: list[str], generation: int) -> tuple[bool, str]:
    """Whether KubeRay has seen ``generation`` and reports each of ``apps`` RUNNING with every
    deployment serving (``SERVING``: healthy, or in a scale event, which Serve counts as running) on
    the active cluster; else what is missing."""
    status = service.get("status") or {}
    if int(status.get("observedGeneration") or 0) < generation:
        return False, f"KubeRay has not seen generation {generation} yet"
    found = (status.get("activeServiceStatus") or {}).get("applicationStatuses") or {}
    waiting = []
    for app in apps:
        app_status = found.get(app) or {}
        unhealthy = sorted(
            name
            for name, d in (app_status.get("serveDeploymentStatuses") or {}).items()
            if d.get("status") not in SERVING
        )
        if app_status.get("status") != "RUNNING" or unhealthy:
            waiting.append(
                f"{app} {app_status.get('status', 'absent')}{(' ' + ', '.join(unhealthy)) if unhealthy else ''}"
            )
    return (not waiting), ", ".join(waiting)


def roll_serve(
    api: Api,
    namespace: str,
    name: str,
    target_text: str,
    step_s: float,
    window_s: float | None = None,
    job: str = "",
    poll_s: float = 5.0,
    settle_s: float = SETTLE_S,
    load: Any = None,
    dump: Any = None,
    code: dict[str, str] | None = None,
) -> int:
    """Roll the RayService's Serve applications onto ``target_text`` one application at a time;
    ``load``/``dump``: YAML's (PyYAML, the Ray image's; a test may pass JSON's)."""
    if load is None or dump is None:
        import yaml

        load = load or yaml.safe_load
        dump = dump or (lambda config: yaml.safe_dump(config, sort_keys=False, default_flow_style=False))
    path = f"/apis/ray.io/v1/namespaces/{namespace}/rayservices/{name}"
    target = load(target_text)
    deadline_s = step_s * max(1, len(target["applications"]))
    api.until = time.monotonic() + deadline_s
    progress = Progress(api, namespace, job, deadline_s, window_s)
    progress.start()
    try:
        service = api.call("GET", path)
    except urllib.error.HTTPError as error:
        if error.code != 404:
            raise
        progress.done()
        print(f"{NO_SERVICE_LINE}: {name} is created with this config", flush=True)
        return 0
    head = (((service.get("spec") or {}).get("rayClusterConfig") or {}).get("headGroupSpec") or {}).get(
        "template"
    ) or {}
    # The head's code digests, and the RayService's cluster-config digest (under recreate: a new
    # one means the cluster is rebuilt with this deploy, the serve config with it).
    running = {
        **((service.get("metadata") or {}).get("annotations") or {}),
        **((head.get("metadata") or {}).get("annotations") or {}),
    }
    new_code = sorted(key for key, digest in (code or {}).items() if running.get(key) != digest)
    if new_code:  # the config may need that code, which the pods get with the RayService's manifest
        progress.done()
        print(f"{NEW_CODE_LINE} ({', '.join(new_code)}): the serve config goes with the RayService", flush=True)
        return 0
    current = load((service.get("spec") or {}).get("serveConfigV2") or "") or {}
    steps = rollout_steps(current, target) if current != target else []
    if not steps:
        progress.done()
        print(f"{UNCHANGED_LINE}: {name} serves it already", flush=True)
        return 0
    before = {app["name"]: app for app in current.get("applications") or []}
    for number, step in enumerate(steps, 1):
        last = number == len(steps)
        changed = [a["name"] for a in step["applications"] if before.get(a["name"]) != a] or [
            a["name"] for a in step["applications"]
        ]
        text = target_text if last else dump(step)
        answer = api.call("PATCH", path, {"spec": {"serveConfigV2": text}}, "application/merge-patch+json")
        generation = int((answer.get("metadata") or {}).get("generation") or 0)
        print(f"{STEP_LINE} {number}/{len(steps)}: {', '.join(changed)} (generation {generation})", flush=True)
        patched, end, good, why = time.monotonic(), time.monotonic() + step_s, 0, ""
        while True:
            ok, why = step_serving(api.call("GET", path), [a["name"] for a in step["applications"]], generation)
            good = good + 1 if ok and time.monotonic() - patched >= settle_s else 0
            if good >= 2:
                break
            if time.monotonic() >= end:
                return Progress.failed(f"{FAILED_LINE}: step {number}/{len(steps)} ({', '.join(changed)}) of {name} "
                                       f"did not serve within {step_s:.0f} s: {why}")  # fmt: skip
            progress.tick()
            time.sleep(poll_s)
        before = {app["name"]: app for app in step["applications"]}
    progress.done()
    print(f"{ROLLED_LINE}: {len(steps)} step(s), {time.monotonic() - progress.started:.0f} s", flush=True)
    return 0


def main() -> int:
    mode = os.environ.get(ENV["mode"], "cluster")
    if mode == "serve":
        values = {
            key: os.environ.get(ENV[key], "")
            for key in ("service", "namespace", "serve_config", "step", "window", "job")
        }
        return roll_serve(Api(), values["namespace"], values["service"], values["serve_config"], float(values["step"]),
                          window_s=float(values["window"]), job=values["job"])  # fmt: skip
    values = {key: os.environ[name] for key, name in ENV.items() if key not in ("mode", "serve_config", "step")}
    return converge(Api(), values["namespace"], values["service"], values["digest"], float(values["deadline"]),
                    bounds=json.loads(values["bounds"]), window_s=float(values["window"]),
                    job=values["job"])  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
