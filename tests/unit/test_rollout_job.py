"""The rollout Job's program (rollout/eks_pd_rollout.py) against a Kubernetes API that keeps
RayServices and RayClusters as KubeRay 1.7 does (read in rayservice_controller.go): a deleted
active cluster is followed by a pending one built from the current spec, which becomes active once
its Serve applications are RUNNING. The program runs as the pod runs it (a subprocess, its env),
against that API over HTTP; what KubeRay and the cluster do is this emulation's, not run."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from support import FakeApiHandler, fake_api, run_rollout_program

from eks_pd_serving import rollout

NS, NAME, NEW, OLD = "inference", "ray-llm", "new-digest", "old-digest"
JOB = "ray-llm-rollout-new-digest-abcdef"
ANNOTATION = rollout.digest_annotation()


def cluster(name: str, digest: str | None, max_replicas: int = 2) -> dict[str, Any]:
    annotations = {ANNOTATION: digest} if digest else {}
    return {
        "metadata": {"name": name, "annotations": annotations, "labels": {"ray.io/originated-from-cr-name": NAME}},
        "spec": {
            "workerGroupSpecs": [{"groupName": "gpu", "replicas": 1, "minReplicas": 1, "maxReplicas": max_replicas}]
        },
    }


class Cluster:
    """The API's state, and KubeRay's moves after a deletion (``rebuild_after`` polls): the new
    cluster carries the RayService's digest at the time. ``applied`` is the RayService's digest
    (its manifest), ``reverted_after`` the polls after which it becomes ``OLD`` (a rollback that
    applies the Job's manifest first)."""

    def __init__(
        self,
        clusters: list[dict[str, Any]],
        spec_max: int = 2,
        rebuild_after: int | None = 1,
        applied: str = NEW,
        reverted_after: int | None = None,
    ) -> None:
        self.clusters = {c["metadata"]["name"]: c for c in clusters}
        self.active = next(iter(self.clusters), None)
        self.spec_max = spec_max
        self.rebuild_after = rebuild_after
        self.applied, self.reverted_after = applied, reverted_after
        self.polls = self.reads = 0
        self.job_marks: dict[str, str] = {}
        self.calls: list[tuple[str, str, Any]] = []
        #: The answers the API server gives the next calls instead of serving them (an HTTP status,
        #: or "drop": the connection closed unanswered), as a busy or restarting API server does.
        self.failures: list[int | str] = []
        self.lock = threading.Lock()

    def service(self) -> dict[str, Any]:
        self.reads += 1
        if self.reverted_after is not None and self.reads > self.reverted_after:
            self.applied = OLD
        if self.active not in self.clusters:  # KubeRay: no active cluster, build one from the spec
            self.polls += 1
            if self.rebuild_after is not None and self.polls > self.rebuild_after:
                self.clusters["ray-llm-abcde"] = cluster("ray-llm-abcde", self.applied, self.spec_max)
                self.active = "ray-llm-abcde"
        running = self.active in self.clusters
        apps = {"pd-openai": {"status": "RUNNING" if running else "DEPLOYING"}}
        return {
            "metadata": {"name": NAME, "annotations": {ANNOTATION: self.applied}},
            "spec": {
                "rayClusterConfig": {
                    "workerGroupSpecs": [
                        {"groupName": "gpu", "replicas": 1, "minReplicas": 1, "maxReplicas": self.spec_max}
                    ]
                }
            },
            "status": {"activeServiceStatus": {"rayClusterName": self.active, "applicationStatuses": apps}}
            if running
            else {"pendingServiceStatus": {"rayClusterName": "ray-llm-abcde", "applicationStatuses": apps}},
        }


@pytest.fixture
def api() -> Iterator[tuple[str, list[Cluster]]]:
    state: list[Cluster] = []

    class Handler(FakeApiHandler):
        def handle_request(self, method: str, body: Any) -> None:
            (world,) = state
            assert self.headers["Authorization"] == "Bearer test-token"
            with world.lock:
                if world.failures:
                    failure = world.failures.pop(0)
                    if failure == "drop":
                        self.close_connection = True
                        self.connection.shutdown(2)
                        return None
                    return self.answer({"message": "try again"}, int(failure))
                world.calls.append((method, self.path, body))
                base = f"/apis/ray.io/v1/namespaces/{NS}"
                if method == "GET" and self.path.startswith(f"{base}/rayclusters?labelSelector="):
                    assert "ray.io%2Foriginated-from-cr-name%3Dray-llm" in self.path
                    return self.answer({"items": list(world.clusters.values())})
                if method == "GET" and self.path == f"{base}/rayservices/{NAME}":
                    return self.answer(world.service())
                if method == "DELETE" and self.path.startswith(f"{base}/rayclusters/"):
                    world.clusters.pop(self.path.rsplit("/", 1)[1])
                    return self.answer({})
                if method == "PATCH" and self.path.startswith(f"/apis/batch/v1/namespaces/{NS}/jobs/"):
                    assert self.headers["Content-Type"] == "application/merge-patch+json"
                    world.job_marks.update((body or {})["metadata"]["annotations"])
                    return self.answer({})
                if method == "PATCH" and self.path.startswith(f"{base}/rayclusters/"):
                    assert self.headers["Content-Type"] == "application/json-patch+json"
                    target = world.clusters[self.path.rsplit("/", 1)[1]]
                    for op in body or []:
                        _, _, _, index, field = op["path"].split("/")
                        target["spec"]["workerGroupSpecs"][int(index)][field] = op["value"]
                    return self.answer(target)
            self.answer({"message": "not found"}, 404)

    with fake_api(Handler) as base:
        yield base, state


def run(
    base: str, deadline_s: float = 20, digest: str = NEW, max_replicas: int = 2, window_s: float | None = None
) -> subprocess.CompletedProcess[str]:
    """The program as the Job runs it, with a test's API in place of the in-cluster one, for the
    config ``digest``, the gpu group's ``max_replicas`` and the wait's ``window_s`` (the Job's env)."""
    bounds = {"gpu": {"replicas": 1, "minReplicas": 1, "maxReplicas": max_replicas}}
    window = window_s or deadline_s
    return run_rollout_program(
        base,
        "converge",
        f"api, {NS!r}, {NAME!r}, {digest!r}, {deadline_s!r}, bounds={bounds!r}, window_s={window!r}, "
        f"job={JOB!r}, poll_s=0.05",
    )


def test_a_cluster_built_from_an_older_spec_is_deleted_and_the_job_waits_until_the_new_one_serves(api: Any) -> None:
    base, state = api
    state.append(world := Cluster([cluster("ray-llm-old", OLD)], rebuild_after=3))
    ran = run(base)
    assert ran.returncode == 0, ran.stderr
    assert (
        "DELETE",
        f"/apis/ray.io/v1/namespaces/{NS}/rayclusters/ray-llm-old",
        {"propagationPolicy": "Background"},
    ) in world.calls
    assert "rollout: deleted RayCluster ray-llm-old (config old-digest, the spec's is new-digest)" in ran.stdout
    assert "rollout: waiting: " in ran.stdout  # it waited for KubeRay's rebuild
    assert ran.stdout.strip().endswith("rollout: serving from RayCluster ray-llm-abcde with config new-digest")


def test_throttled_or_failing_api_calls_are_tried_again_inside_the_deadline(api: Any) -> None:
    """One 429, 5xx or dropped connection (a rollout makes about 150 calls) no longer fails the Job,
    and with it the deploy, after the whole wait: each is tried again with backoff."""
    base, state = api
    state.append(world := Cluster([cluster("ray-llm-old", OLD)], rebuild_after=2))
    world.failures = [429, 503, "drop", 500, 504]
    ran = run(base)
    assert ran.returncode == 0, (ran.stdout, ran.stderr)
    assert ran.stdout.count("rollout: the API server did not answer") == 5
    assert "HTTP 429" in ran.stdout and "HTTP 503" in ran.stdout
    assert ran.stdout.strip().endswith("rollout: serving from RayCluster ray-llm-abcde with config new-digest")


def test_a_client_error_is_not_tried_again_and_a_deadline_bounds_the_retries(api: Any) -> None:
    base, state = api
    state.append(world := Cluster([cluster("ray-llm-old", OLD)]))
    world.failures = [403]
    ran = run(base)
    assert ran.returncode == 1 and "HTTP Error 403" in ran.stderr
    state[:] = [world := Cluster([cluster("ray-llm-old", OLD)])]
    world.failures = [503] * 1000
    ran = run(base, deadline_s=3)
    assert ran.returncode == 1 and "HTTP Error 503" in ran.stderr


def test_a_cluster_from_before_the_digest_existed_counts_as_stale(api: Any) -> None:
    base, state = api
    state.append(world := Cluster([cluster("ray-llm-old", None)]))
    assert run(base).returncode == 0
    assert [c for c in world.calls if c[0] == "DELETE"]


def test_nothing_stale_is_a_first_deploy_or_a_serve_only_change_and_passes_at_once(api: Any) -> None:
    base, state = api
    for clusters in ([], [cluster("ray-llm-new", NEW)]):
        state[:] = [world := Cluster(clusters)]
        ran = run(base)
        assert ran.returncode == 0 and "rollout: nothing to rebuild" in ran.stdout
        assert not [c for c in world.calls if c[0] == "DELETE" or (c[0] == "PATCH" and "/rayclusters/" in c[1])]


def test_new_worker_bounds_are_set_in_place_without_a_rebuild(api: Any) -> None:
    """KubeRay under None pushes no bound change (its hash leaves them out); the Job does."""
    base, state = api
    state.append(world := Cluster([cluster("ray-llm-new", NEW, max_replicas=2)], spec_max=4))
    ran = run(base, max_replicas=4)
    assert ran.returncode == 0, ran.stderr
    assert not [c for c in world.calls if c[0] == "DELETE"]
    assert world.clusters["ray-llm-new"]["spec"]["workerGroupSpecs"][0]["maxReplicas"] == 4


def test_a_cluster_that_does_not_come_back_fails_with_one_line_naming_what_is_missing(api: Any) -> None:
    base, state = api
    state.append(Cluster([cluster("ray-llm-old", OLD)], rebuild_after=None))
    ran = run(base, deadline_s=0.5)
    assert ran.returncode == 1
    (line,) = ran.stderr.strip().splitlines()
    assert line == (
        "rollout failed: ray-llm did not serve on config new-digest within 0 s: "
        "KubeRay has not created a RayCluster from the new spec yet"
    )


def test_a_rollback_rebuilds_the_cluster_back_even_when_its_job_is_applied_before_the_rayservice(
    api: Any,
) -> None:
    """The rollback's Job (config OLD) meets the cluster of the failed deploy (NEW) while the
    RayService still says NEW: it waits for the RayService, deletes the NEW cluster and waits until
    KubeRay's rebuild from the reverted spec serves. (That the Job runs at all on a rollback is the
    manifest's prune: tests/template/test_rollout.py.)"""
    base, state = api
    state.append(world := Cluster([cluster("ray-llm-new", NEW)], rebuild_after=2, reverted_after=3))
    ran = run(base, digest=OLD)
    assert ran.returncode == 0, ran.stderr
    assert "rollout: waiting: the RayService has config new-digest, not yet old-digest" in ran.stdout
    assert "rollout: deleted RayCluster ray-llm-new (config new-digest, the spec's is old-digest)" in ran.stdout
    assert ran.stdout.strip().endswith("rollout: serving from RayCluster ray-llm-abcde with config old-digest")
    assert digest_of_active(world) == OLD


def digest_of_active(world: Cluster) -> str:
    return str(world.clusters[str(world.active)]["metadata"]["annotations"][ANNOTATION])


def test_a_rayservice_that_never_carries_the_jobs_config_fails_the_job_and_deletes_nothing(api: Any) -> None:
    base, state = api
    state.append(world := Cluster([cluster("ray-llm-new", NEW)]))
    ran = run(base, deadline_s=0.3, digest=OLD)
    assert ran.returncode == 1
    assert "the RayService has config new-digest, not yet old-digest" in ran.stderr
    assert not [c for c in world.calls if c[0] == "DELETE"]


def test_the_job_marks_its_start_each_window_and_at_success_every_window(api: Any) -> None:
    """The deploy waits in steps of at most 14 minutes (the kubectl handler's Lambda runs 15): one
    on the Job's start, one per window of its deadline but the last, one on its success. The Job
    marks each step on itself; at success every window at once, so the remaining steps pass."""
    base, state = api
    state.append(world := Cluster([cluster("ray-llm-old", OLD)], rebuild_after=30))
    ran = run(base, deadline_s=20, window_s=0.5)  # 40 windows: the first few pass while it waits
    assert ran.returncode == 0, ran.stderr
    marks = world.job_marks
    assert marks.pop("eks-pd.io/rollout-started") == "true"
    assert sorted(marks, key=lambda k: int(k.rsplit("-", 1)[1])) == [
        f"eks-pd.io/rollout-window-{k}" for k in range(1, 40)
    ]
    assert set(marks.values()) == {"done"}
    patches = [c for c in world.calls if c[0] == "PATCH" and "/jobs/" in c[1]]
    assert patches[0][1] == f"/apis/batch/v1/namespaces/{NS}/jobs/{JOB}"
    assert any(set(c[2]["metadata"]["annotations"].values()) == {"passed"} for c in patches)  # while it waited


def test_a_job_that_fails_never_marks_the_last_windows(api: Any) -> None:
    base, state = api
    state.append(world := Cluster([cluster("ray-llm-old", OLD)], rebuild_after=None))
    ran = run(base, deadline_s=1.0, window_s=0.4)  # windows 1 and 2 of 3
    assert ran.returncode == 1
    assert world.job_marks.get("eks-pd.io/rollout-window-2") in (None, "passed")
    assert "done" not in world.job_marks.values()


# --- the Job's calls against its Role (RBAC is the Job's IAM: the emulated API grants everything) ---
def _role_rules(rules_override: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    import cdk8s

    from eks_pd_serving.k8s import PodProgram, RolloutChart, RolloutSpec

    program = PodProgram("c", rollout.FILE_NAME, rollout.source(), rollout.source_digest(), rollout.MOUNT_PATH, "a")
    spec = RolloutSpec(NAME, NS, NEW, program, rollout.env_names(), "image", {"role": "system"}, 60, 30, 840,
                       rollout.pod_job_label(), rollout.FINISHED_TTL_S, template_digest="abcdef")  # fmt: skip
    assert spec.job_name == JOB  # the Job the test's calls mark
    (role,) = [o for o in RolloutChart(cdk8s.App(), "R", spec=spec).to_json() if o["kind"] == "Role"]
    return rules_override if rules_override is not None else role["rules"]


def _denied(calls: list[tuple[str, str, Any]], rules: list[dict[str, Any]]) -> list[str]:
    """The calls the Role does not allow, read as the API server authorizes them."""
    denied = []
    for method, path, _ in calls:
        parts = path.split("?")[0].split("/")  # /apis/ray.io/v1/namespaces/<ns>/<resource>[/<name>]
        resource, name = parts[6], (parts[7] if len(parts) > 7 else None)
        verb = {"GET": "get" if name else "list", "DELETE": "delete", "PATCH": "patch"}[method]
        if not any(
            resource in r["resources"]
            and verb in r["verbs"]
            and (name is None or name in r.get("resourceNames", [name]))
            for r in rules
        ):
            denied.append(f"{verb} {resource}/{name or ''}")
    return denied


def test_every_call_the_job_makes_is_allowed_by_its_role_and_a_removed_grant_is_caught(api: Any) -> None:
    base, state = api
    state.append(world := Cluster([cluster("ray-llm-old", OLD)]))
    assert run(base).returncode == 0
    state[:] = [bounds := Cluster([cluster("ray-llm-new", NEW, max_replicas=2)], spec_max=4)]
    assert run(base, max_replicas=4).returncode == 0
    calls = world.calls + bounds.calls
    assert {c[0] for c in calls} == {"GET", "DELETE", "PATCH"}  # every kind of call was made
    assert any("/jobs/" in c[1] for c in calls)  # its own Job's marks
    assert _denied(calls, _role_rules()) == []
    without_patch = [{**r, "verbs": [v for v in r["verbs"] if v != "patch"]} for r in _role_rules()]
    assert set(_denied(calls, _role_rules(without_patch))) == {f"patch jobs/{JOB}", "patch rayclusters/ray-llm-new"}
    other_job = [{**r, "resourceNames": ["other"]} if r["resources"] == ["jobs"] else r for r in _role_rules()]
    assert f"patch jobs/{JOB}" in _denied(calls, _role_rules(other_job))
    other_service = [{**r, "resourceNames": ["other"]} if "resourceNames" in r else r for r in _role_rules()]
    assert "get rayservices/ray-llm" in _denied(calls, _role_rules(other_service))
