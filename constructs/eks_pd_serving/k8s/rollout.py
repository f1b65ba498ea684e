"""The rollout Job's chart (``ray_upgrade_strategy=recreate``): the Job made for one cluster-config
digest and one set of worker bounds (its name carries the config digest and a digest of its whole
spec, so a new spec, new bounds, new code or any other change of its pod template is a new Job, and
a Job's immutable pod template is never changed in place), its program in a ConfigMap, and the
service account and Role it runs with: read the RayService, list, delete and patch its RayClusters.
Nothing else in the cluster."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import cdk8s
from constructs import Construct

from .specs import PodProgram

# A label value's limit: the Job controller labels the Job's pods with its name
# (``batch.kubernetes.io/job-name``), and a longer one is refused when the Job is created.
JOB_NAME_MAX = 63


@dataclass(frozen=True)
class RolloutSpec:
    """One rollout: the RayService it converges, the digest it converges to, and how."""

    ray_service: str
    namespace: str
    #: The digest of the RayService's rayClusterConfig (``rollout.cluster_config_digest``).
    digest: str
    program: PodProgram
    #: The program's env names (the pod module's ``ENV``), by what they hold.
    env_names: dict[str, str]
    image: str
    node_selector: dict[str, str]
    #: How long the Job waits for the rebuilt cluster to serve before it fails.
    deadline_s: int
    #: The windows of ``deadline_s`` the Job marks on itself (the deploy's wait steps), and how long
    #: its pod may take to start (its image pulled) beside the deadline.
    window_s: int
    pod_start_s: int
    #: The Job controller's label on its pods that names their Job (the program marks its Job).
    pod_job_label: str
    #: How long Kubernetes keeps the Job once it finished (``ttlSecondsAfterFinished``): long
    #: enough for the deploy's remaining waits to read a success, short enough that a failed Job a
    #: rollback left in place (a rollback to a version that did not prune it) is gone before the next
    #: deploy applies the same Job again and waits on it.
    finished_ttl_s: int
    #: Each worker group's replicas and bounds, by group name: the Job sets them in place.
    bounds: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    #: A digest of ``job_spec(self)`` as the template holds it (tokens resolved): the Job's name
    #: carries it, so any change of the spec is a new Job. Empty: the spec's own text.
    template_digest: str = ""
    #: ``cluster``: rebuild the Ray cluster onto ``digest`` (``ray_upgrade_strategy=recreate``);
    #: ``serve``: roll ``serve_config`` (the RayService's serveConfigV2 text) one Serve application at
    #: a time, each step bounded by ``step_s``, unless the pods' code (``code``: annotation to
    #: digest, as the head's template carries them) changes with the same deploy.
    mode: str = "cluster"
    serve_config: str = ""
    step_s: int = 0
    code: Mapping[str, str] = field(default_factory=dict)
    #: The chart ships ``program``'s ConfigMap; False: it is shipped elsewhere, once for every rollout
    #: Job (``RayServiceProps.rollout_program``, with the namespace chart). Default: True.
    ships_program: bool = True

    @property
    def _part(self) -> str:
        return "rollout" if self.mode == "cluster" else "serve-rollout"

    @property
    def job_name(self) -> str:
        """``<service>-rollout-<config digest>-<spec digest>``, the service's part cut so the name
        fits ``JOB_NAME_MAX`` (the Job controller copies it into a pod label): the spec digest,
        which holds the whole service name, keeps two long names apart."""
        spec = self.template_digest or spec_digest(job_spec(self))
        suffix = f"-{self._part}-{self.digest[:10]}-{spec[:6]}"
        return f"{self.ray_service[: JOB_NAME_MAX - len(suffix)].rstrip('-')}{suffix}"

    @property
    def service_account(self) -> str:
        return f"{self.ray_service}-{self._part}"


class RolloutChart(cdk8s.Chart):
    def __init__(self, scope: Construct, id: str, *, spec: RolloutSpec) -> None:
        super().__init__(scope, id, disable_resource_name_hashes=True, namespace=spec.namespace)
        namespace = spec.namespace
        account = spec.service_account
        cdk8s.ApiObject(
            self, "ServiceAccount", api_version="v1", kind="ServiceAccount",
            metadata=cdk8s.ApiObjectMetadata(name=account, namespace=namespace),
        )  # fmt: skip
        role = cdk8s.ApiObject(
            self, "Role", api_version="rbac.authorization.k8s.io/v1", kind="Role",
            metadata=cdk8s.ApiObjectMetadata(name=account, namespace=namespace),
        )  # fmt: skip
        role.add_json_patch(
            cdk8s.JsonPatch.add(
                "/rules",
                [
                    *_ray_rules(spec),
                    # Its own Job: the annotations the deploy's wait steps read.
                    {
                        "apiGroups": ["batch"],
                        "resources": ["jobs"],
                        "resourceNames": [spec.job_name],
                        "verbs": ["patch"],
                    },
                ],
            )
        )
        binding = cdk8s.ApiObject(
            self, "RoleBinding", api_version="rbac.authorization.k8s.io/v1", kind="RoleBinding",
            metadata=cdk8s.ApiObjectMetadata(name=account, namespace=namespace),
        )  # fmt: skip
        binding.add_json_patch(
            cdk8s.JsonPatch.add("/roleRef", {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account}),
            cdk8s.JsonPatch.add(
                "/subjects", [{"kind": "ServiceAccount", "name": account, "namespace": spec.namespace}]
            ),
        )
        program = spec.program
        if spec.ships_program:
            cdk8s.ApiObject(
                self, "Code", api_version="v1", kind="ConfigMap",
                metadata=cdk8s.ApiObjectMetadata(name=program.config_map, namespace=namespace),
            ).add_json_patch(cdk8s.JsonPatch.add("/data", {program.file_name: program.source}))  # fmt: skip
        job = cdk8s.ApiObject(
            self, "Job", api_version="batch/v1", kind="Job",
            metadata=cdk8s.ApiObjectMetadata(name=spec.job_name, namespace=namespace),
        )  # fmt: skip
        job.add_json_patch(cdk8s.JsonPatch.add("/spec", job_spec(spec)))


def _ray_rules(spec: RolloutSpec) -> list[dict[str, Any]]:
    """What the Job may do to Ray's objects: read the RayService and list, delete and patch its
    RayClusters (cluster), or read and patch the RayService alone (serve: its serveConfigV2)."""
    service = {"apiGroups": ["ray.io"], "resources": ["rayservices"], "resourceNames": [spec.ray_service]}
    if spec.mode == "serve":
        return [{**service, "verbs": ["get", "patch"]}]
    return [
        {**service, "verbs": ["get"]},
        {"apiGroups": ["ray.io"], "resources": ["rayclusters"], "verbs": ["list", "delete", "patch"]},
    ]


def spec_digest(spec: Any) -> str:
    """The digest a Job's name carries: of its spec's JSON (resolved to the template's form first
    where it holds tokens)."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def job_spec(spec: RolloutSpec) -> dict[str, Any]:
    """The Job's spec (without its name, which carries this spec's digest)."""
    program = spec.program
    values: tuple[tuple[str, str], ...] = (
        ("service", spec.ray_service),
        ("namespace", spec.namespace),
        ("digest", spec.digest),
        ("deadline", str(spec.deadline_s)),
        ("bounds", json.dumps({g: dict(b) for g, b in spec.bounds.items()}, sort_keys=True)),
        ("window", str(spec.window_s)),
    )
    if spec.mode == "serve":
        values = (
            ("service", spec.ray_service),
            ("namespace", spec.namespace),
            ("mode", spec.mode),
            ("serve_config", spec.serve_config),
            ("step", str(spec.step_s)),
            ("code", json.dumps(dict(spec.code), sort_keys=True)),
            ("window", str(spec.window_s)),
        )
    env: list[dict[str, Any]] = [{"name": spec.env_names[key], "value": value} for key, value in values]
    env.append(
        {
            "name": spec.env_names["job"],
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{spec.pod_job_label}']"}},
        }
    )
    return {
        # One attempt: a second would find nothing stale and pass without the wait.
        "backoffLimit": 0,
        "activeDeadlineSeconds": spec.deadline_s + spec.pod_start_s,
        "ttlSecondsAfterFinished": spec.finished_ttl_s,
        "template": {
            "metadata": {"annotations": {program.annotation: program.digest}},
            "spec": {
                "serviceAccountName": spec.service_account,
                "restartPolicy": "Never",
                "nodeSelector": dict(spec.node_selector),
                # Beside the Ray head, whose image it runs: already pulled there (tens of GB).
                "affinity": {
                    "podAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [
                            {
                                "weight": 100,
                                "podAffinityTerm": {
                                    "labelSelector": {"matchLabels": {"ray.io/node-type": "head"}},
                                    "topologyKey": "kubernetes.io/hostname",
                                },
                            }
                        ]
                    }
                },
                "containers": [
                    {
                        "name": "rollout",
                        "image": spec.image,
                        "command": ["python", f"{program.mount_path}/{program.file_name}"],
                        "env": env,
                        "resources": {
                            "requests": {"cpu": "50m", "memory": "64Mi"},
                            "limits": {"memory": "128Mi"},
                        },
                        "securityContext": {
                            "allowPrivilegeEscalation": False,
                            # The Ray image's own user (ray, uid 1000), given as a number.
                            "runAsUser": 1000,
                            "runAsNonRoot": True,
                        },
                        "volumeMounts": [{"name": "code", "mountPath": program.mount_path, "readOnly": True}],
                    }
                ],
                "volumes": [{"name": "code", "configMap": {"name": program.config_map}}],
            },
        },
    }
