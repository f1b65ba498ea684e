"""The IAM rung: the AWS calls a principal's code makes, recorded in the tests that run that code,
judged against the principal's policies as synthesized.

- ``Recorder`` hooks a boto3 client's events (``before-call`` for the request, ``after-call`` for
  S3's answer) and writes down each call as the IAM action(s) and resource ARN(s) AWS authorizes.
  S3's rule for a missing key is applied here: GetObject/HeadObject of a key that does not exist
  also needs ``s3:ListBucket`` on the bucket, else S3 answers 403 AccessDenied, not 404 (S3 API
  reference, GetObject, "Permissions"). moto answers 404 either way; this is what moto cannot see.
- ``principal_policies`` resolves the template's policies for one role (Ref, GetAtt, Join and the
  pseudo parameters, to ARNs of a test account and region).
- ``allowed`` evaluates one call: an explicit Deny wins, else some Allow must match action,
  resource and conditions. It is hand-written (wildcards as IAM matches them: case-insensitive
  actions, case-sensitive resources; StringEquals/StringLike/ArnLike conditions, a missing context
  key failing the condition): PyPI has no maintained IAM evaluator for Python (policyuniverse only
  expands actions), and AWS's own simulator needs an account.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any

ACCOUNT, REGION, PARTITION = "111122223333", "us-east-1", "aws"
# The stack's own id (AWS::StackId), as a test's CloudFormation event carries it.
STACK_ID = (
    f"arn:{PARTITION}:cloudformation:{REGION}:{ACCOUNT}:stack/RayLlmPdServing/5b6c1f30-0000-0000-0000-000000000000"
)

# Operation -> the IAM action AWS authorizes it as, for the operations the stack's code calls.
_S3_OBJECT_ACTIONS = {
    "GetObject": "s3:GetObject",
    "HeadObject": "s3:GetObject",
    "PutObject": "s3:PutObject",
    "CreateMultipartUpload": "s3:PutObject",
    "UploadPart": "s3:PutObject",
    "CompleteMultipartUpload": "s3:PutObject",
    "AbortMultipartUpload": "s3:AbortMultipartUpload",
    "DeleteObject": "s3:DeleteObject",
}
_MISSING_KEY_CODES = ("NoSuchKey", "404", "NotFound")


@dataclass(frozen=True)
class Call:
    """One authorization AWS makes: an action on a resource, with the request's condition keys."""

    action: str
    resource: str
    context: tuple[tuple[str, str], ...] = ()
    why: str = ""

    def __str__(self) -> str:
        return f"{self.action} on {self.resource}" + (f" ({self.why})" if self.why else "")


@dataclass
class Recorder:
    """Records what a boto3 client's calls ask IAM for. ``attach`` it to each client the code uses."""

    calls: list[Call] = field(default_factory=list)

    def attach(self, client: Any) -> Any:
        client.meta.events.register("after-call.*.*", self._after)
        return client

    def _after(self, http_response: Any, parsed: dict[str, Any], model: Any, context: Any = None, **_: Any) -> None:
        service = model.service_model.signing_name
        params = (context or {}).get("eks_pd_params") or {}
        self.calls.extend(authorizations(service, model.name, params, parsed))


def authorizations(service: str, operation: str, params: dict[str, Any], parsed: dict[str, Any]) -> list[Call]:
    """What AWS authorizes for one call: its operation, parameters and (for S3's missing-key rule) answer."""
    if service == "secretsmanager" and "SecretId" in params:
        return [Call(f"secretsmanager:{operation}", str(params["SecretId"]))]
    if service == "servicequotas" and "QuotaCode" in params:
        quota = f"arn:{PARTITION}:servicequotas:{REGION}:{ACCOUNT}:{params['ServiceCode']}/{params['QuotaCode']}"
        return [Call(f"servicequotas:{operation}", quota)]
    if service == "eks" and "nodegroupName" in params:
        nodegroup = (
            f"arn:{PARTITION}:eks:{REGION}:{ACCOUNT}:nodegroup/{params['clusterName']}/{params['nodegroupName']}"
        )
        return [Call(f"eks:{operation}", f"{nodegroup}/recorded-id")]
    if service == "scheduler" and "Name" in params:
        schedule = f"arn:{PARTITION}:scheduler:{REGION}:{ACCOUNT}:schedule/{params.get('GroupName', 'default')}/"
        calls = [Call(f"scheduler:{operation}", schedule + str(params["Name"]))]
        if operation == "UpdateSchedule":  # Scheduler checks that the caller may pass the target's role
            calls.append(Call("iam:PassRole", str(params["Target"]["RoleArn"]), why="the schedule's target role"))
        return calls
    if service == "cloudformation" and str(params.get("StackName", "")).startswith("arn:"):
        return [Call(f"cloudformation:{operation}", str(params["StackName"]))]
    if service == "sns" and "TopicArn" in params:
        return [Call(f"sns:{operation}", str(params["TopicArn"]))]
    if service != "s3":
        return [Call(f"{service}:{operation}", "*")]
    bucket, key = params.get("Bucket", ""), params.get("Key")
    if operation in _S3_OBJECT_ACTIONS and key is not None:
        calls = [Call(_S3_OBJECT_ACTIONS[operation], f"arn:{PARTITION}:s3:::{bucket}/{key}")]
        status = parsed.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = parsed.get("Error", {}).get("Code")
        if operation in ("GetObject", "HeadObject") and (status == 404 or code in _MISSING_KEY_CODES):
            # No s3:prefix in this request's context: a prefix-conditioned ListBucket does not count.
            calls.append(Call("s3:ListBucket", f"arn:{PARTITION}:s3:::{bucket}", why=f"{key} is missing: 404 not 403"))
        return calls
    if operation in ("ListObjectsV2", "ListObjects"):
        return [Call("s3:ListBucket", f"arn:{PARTITION}:s3:::{bucket}", (("s3:prefix", params.get("Prefix", "")),))]
    return [Call(f"s3:{operation}", f"arn:{PARTITION}:s3:::{bucket}")]


def record(client: Any, recorder: Recorder) -> Any:
    """Attach ``recorder`` to ``client``, keeping each call's parameters for the after-call hook."""

    def keep(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["eks_pd_params"] = dict(params)

    client.meta.events.register("provide-client-params.*.*", keep)
    return recorder.attach(client)


def resolve(value: Any, template: dict[str, Any], names: dict[str, str]) -> Any:
    """A template value with Ref, GetAtt, Join and Sub's pseudo parameters resolved. ``names``:
    logical id -> the physical name the test gives it (a bucket's name, say)."""
    pseudo = {
        "AWS::AccountId": ACCOUNT,
        "AWS::Region": REGION,
        "AWS::Partition": PARTITION,
        "AWS::URLSuffix": "amazonaws.com",
        "AWS::StackId": STACK_ID,
    }
    if isinstance(value, list):
        return [resolve(v, template, names) for v in value]
    if not isinstance(value, dict):
        return value
    if "Ref" in value:
        ref = value["Ref"]
        return pseudo.get(ref) or names.get(ref, f"{ref.lower()}-physical")
    if "Fn::GetAtt" in value:
        logical, attribute = value["Fn::GetAtt"]
        kind = template["Resources"].get(logical, {}).get("Type", "")
        name = names.get(logical, f"{logical.lower()}-physical")
        if attribute == "Arn" and kind == "AWS::S3::Bucket":
            return f"arn:{PARTITION}:s3:::{name}"
        if not attribute.endswith("Arn"):  # a name attribute (NodegroupName, ...)
            return name
        return f"arn:{PARTITION}:{kind.split('::')[1].lower() if '::' in kind else 'x'}:{REGION}:{ACCOUNT}:{name}"
    if "Fn::Join" in value:
        sep, parts = value["Fn::Join"]
        return sep.join(str(resolve(p, template, names)) for p in parts)
    return {k: resolve(v, template, names) for k, v in value.items()}


def principal_policies(template: dict[str, Any], role_id: str, names: dict[str, str]) -> list[dict[str, Any]]:
    """The statements of every inline policy (AWS::IAM::Policy, the role's own Policies) on a role."""
    statements: list[dict[str, Any]] = []
    for resource in template["Resources"].values():
        props = resource.get("Properties", {})
        if resource["Type"] == "AWS::IAM::Policy" and {"Ref": role_id} in props.get("Roles", []):
            statements.extend(props["PolicyDocument"]["Statement"])
    role = template["Resources"][role_id]["Properties"]
    for policy in role.get("Policies", []):
        statements.extend(policy["PolicyDocument"]["Statement"])
    return [resolve(s, template, names) for s in statements]


def _listed(value: Any) -> list[str]:
    return value if isinstance(value, list) else [value]


def _conditions_hold(conditions: dict[str, dict[str, Any]], context: dict[str, str]) -> bool:
    for operator, tests in conditions.items():
        for key, wanted in tests.items():
            if key not in context:
                return False
            actual, patterns = context[key], _listed(wanted)
            if operator in ("StringEquals", "ArnEquals") and actual not in patterns:
                return False
            if operator in ("StringLike", "ArnLike") and not any(fnmatch.fnmatchcase(actual, p) for p in patterns):
                return False
            if operator not in ("StringEquals", "ArnEquals", "StringLike", "ArnLike"):
                return False  # an operator this evaluator does not know: never assume it allows
    return True


def _matches(statement: dict[str, Any], call: Call) -> bool:
    actions = [a.lower() for a in _listed(statement.get("Action", []))]
    if not any(fnmatch.fnmatchcase(call.action.lower(), a) for a in actions):
        return False
    if not any(fnmatch.fnmatchcase(call.resource, r) for r in _listed(statement.get("Resource", []))):
        return False
    return _conditions_hold(statement.get("Condition", {}), dict(call.context))


def allowed(statements: list[dict[str, Any]], call: Call) -> bool:
    if any(s["Effect"] == "Deny" and _matches(s, call) for s in statements):
        return False
    return any(s["Effect"] == "Allow" and _matches(s, call) for s in statements)


def denied(statements: list[dict[str, Any]], calls: list[Call]) -> list[str]:
    """Each call the policies do not allow, as a line; empty when all are allowed."""
    return [str(c) for c in dict.fromkeys(calls) if not allowed(statements, c)]
