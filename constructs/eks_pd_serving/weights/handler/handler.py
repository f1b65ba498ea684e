"""The weights-staging custom resource (aws-cdk-lib's Provider framework, with is_complete):
on create and update it starts the staging job for the revision and waits for it; the deploy
goes on only once the weights are in the bucket, or fails with the job's one-line reason. Delete
(a rollback's too) stops the project's builds still running, so none stages on, billed, after the
stack has given up on it; the bucket's removal policy decides what happens to the objects."""

from __future__ import annotations

from typing import Any

ERROR = ".staging-error"  # stage.py's error object, beside its marker


class StagingFailed(RuntimeError):
    """One line: what the staging job reported, with the fix."""


def on_event(event: dict[str, Any], context: Any = None, codebuild: Any = None) -> dict[str, Any]:
    props = event["ResourceProperties"]
    physical_id = f"s3://{props['Bucket']}/{props['Prefix']}/"
    if codebuild is None:
        import boto3

        codebuild = boto3.client("codebuild")
    if event["RequestType"] == "Delete":
        stop_running_builds(codebuild, props["ProjectName"], props["Prefix"])
        return {"PhysicalResourceId": event.get("PhysicalResourceId", physical_id)}
    overrides = [{"name": name, "value": str(props[key]), "type": "PLAINTEXT"}
                 for name, key in (("MODEL", "Model"), ("REVISION", "Revision"), ("PREFIX", "Prefix"))]  # fmt: skip
    build = codebuild.start_build(projectName=props["ProjectName"], environmentVariablesOverride=overrides)
    return {"PhysicalResourceId": physical_id, "Data": {"BuildId": build["build"]["id"]}}


def stop_running_builds(codebuild: Any, project: str, prefix: str) -> list[str]:
    """Stop the project's builds still in progress that stage ``prefix`` (newest first: the first
    page holds any that run); return their ids. The job stages every served model's revision, one
    build each (``PREFIX`` in its environment): deleting one model's resource leaves the others'
    builds running. A build that names no prefix is stopped too (nothing says whose it is)."""
    ids = codebuild.list_builds_for_project(projectName=project, sortOrder="DESCENDING").get("ids", [])[:100]
    if not ids:
        return []
    running = [
        b["id"]
        for b in codebuild.batch_get_builds(ids=ids)["builds"]
        if b["buildStatus"] == "IN_PROGRESS" and _staged_prefix(b) in (prefix, None)
    ]
    for build_id in running:
        codebuild.stop_build(id=build_id)
    return running


def _staged_prefix(build: dict[str, Any]) -> str | None:
    """The ``PREFIX`` a build stages, from its environment (the start's override); None without one."""
    variables = (build.get("environment") or {}).get("environmentVariables") or []
    return next((v.get("value") for v in variables if v.get("name") == "PREFIX"), None)


def is_complete(event: dict[str, Any], context: Any = None, codebuild: Any = None, s3: Any = None) -> dict[str, Any]:
    if event["RequestType"] == "Delete":
        return {"IsComplete": True}
    if codebuild is None or s3 is None:
        import boto3

        codebuild, s3 = codebuild or boto3.client("codebuild"), s3 or boto3.client("s3")
    build_id = event["Data"]["BuildId"]
    (build,) = codebuild.batch_get_builds(ids=[build_id])["builds"]
    status = build["buildStatus"]
    if status == "IN_PROGRESS":
        return {"IsComplete": False}
    if status == "SUCCEEDED":
        return {"IsComplete": True}
    props = event["ResourceProperties"]
    try:
        reason = s3.get_object(Bucket=props["Bucket"], Key=f"{props['Prefix']}/{ERROR}")["Body"].read().decode()
    except Exception:  # no reason written: the job itself failed (timeout, pip, out of disk)
        group = build.get("logs", {}).get("groupName", "the project's log group")
        reason = f"the staging job {build_id} ended {status} without a reason; see its log in {group}"
    raise StagingFailed(f"weights staging failed: {reason}")
