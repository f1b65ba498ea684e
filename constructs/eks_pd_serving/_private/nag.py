"""cdk-nag (3.x, the `Validations` API) acknowledgments, each at the narrowest scope."""

from __future__ import annotations

import json
from typing import Any

from aws_cdk import Acknowledgment, Stack, Token, Validations
from constructs import IConstruct

PACK = "AwsSolutions"


def managed_policy(name: str) -> str:
    """The rule id of one AWS managed policy attached to a role (AwsSolutions-IAM4)."""
    return f"{PACK}-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{name}]"


def acknowledge(scope: IConstruct, findings: dict[str, str]) -> None:
    """Acknowledge ``{rule id: reason}`` on ``scope`` and nothing above it."""
    Validations.of(scope).acknowledge(
        *(Acknowledgment(id=f"{PACK}::{rule}", reason=reason) for rule, reason in findings.items())
    )


NODE_ROLE = {
    managed_policy("AmazonEKSWorkerNodePolicy"): (
        "EKS managed node groups require this AWS managed policy on the node role; it is "
        "maintained by AWS as EKS changes and grants only node-to-control-plane actions."
    ),
    managed_policy("AmazonEKS_CNI_Policy"): (
        "The VPC CNI add-on runs on the nodes and needs ENI/IP management; EKS documents this "
        "managed policy for it (pod identity for aws-node is a possible later narrowing)."
    ),
    managed_policy("AmazonEC2ContainerRegistryReadOnly"): (
        "Nodes pull the Ray LLM image from ECR (AWS DLC account 763104351884); read-only, no write or delete actions."
    ),
}

CLUSTER_ROLE = {
    managed_policy("AmazonEKSClusterPolicy"): (
        "The EKS service role must carry this AWS managed policy; EKS does not accept an "
        "equivalent customer policy in its place."
    ),
}


def logical_id(element: IConstruct | None) -> str:
    """The logical id of a CloudFormation element, as cdk-nag prints it inside a finding's id."""
    assert element is not None, "no CloudFormation element to name"
    stack = Stack.of(element)
    return str(stack.resolve(stack.get_logical_id(element)))  # type: ignore[arg-type]


def kubectl_provider(provider: IConstruct) -> dict[str, str]:
    """Findings on aws-cdk-lib's kubectl/Helm provider; two rule ids embed its logical ids."""
    handler = provider.node.find_child("Handler")
    handler_id = logical_id(handler.node.find_child("Resource"))
    condition_id = logical_id(handler.node.find_child("HasEcrPublic"))
    ecr_public = json.dumps(
        {
            "Fn::If": [
                condition_id,
                {
                    "Fn::Join": [
                        "",
                        [
                            "arn:",
                            {"Ref": "AWS::Partition"},
                            ":iam::aws:policy/AmazonElasticContainerRegistryPublicReadOnly",
                        ],
                    ]
                },
                {"Ref": "AWS::NoValue"},
            ]
        },
        separators=(",", ":"),
    )
    lambda_roles = (
        "aws-cdk-lib creates and scopes the kubectl/Helm provider's Lambda roles; this AWS managed "
        "policy is what a Lambda needs for "
    )
    return {
        managed_policy("service-role/AWSLambdaBasicExecutionRole"): lambda_roles + "its CloudWatch logs.",
        managed_policy("service-role/AWSLambdaVPCAccessExecutionRole"): lambda_roles
        + "its ENIs: it runs in the VPC to reach the private API endpoint.",
        managed_policy("AmazonEC2ContainerRegistryReadOnly"): lambda_roles
        + "pulling Helm charts from ECR (read-only).",
        f"{PACK}-IAM4[Policy::{ecr_public}]": lambda_roles
        + "pulling public ECR charts (read-only), attached only in regions that have ECR Public.",
        f"{PACK}-IAM5[Resource::<{handler_id}.Arn>:*]": (
            "The provider framework may invoke any version of its own handler function "
            "(<handler arn>:*); the wildcard covers versions of that one function only."
        ),
        f"{PACK}-L1": (
            "aws-cdk-lib chooses the kubectl handler's runtime together with the kubectl layer it "
            "ships; it moves with aws-cdk-lib upgrades."
        ),
    }


_LAMBDA_LOGS = managed_policy("service-role/AWSLambdaBasicExecutionRole")

CAPACITY_CHECK_FUNCTION = {
    _LAMBDA_LOGS: (
        "The capacity-check Lambda writes only its own CloudWatch logs; this AWS managed policy is "
        "the documented minimum for that."
    ),
    f"{PACK}-IAM5[Resource::*]": (
        "ec2:DescribeInstanceTypes, DescribeInstanceTypeOfferings, DescribeInstances, (with a reserved "
        "group) DescribeCapacityReservations and servicequotas:GetAWSDefaultServiceQuota support no "
        "resource-level permissions (Service "
        "Authorization Reference); all are read-only. GetServiceQuota is scoped to the G/VT and P "
        "quotas the node groups use."
    ),
}


def capacity_block_end(
    function: IConstruct, invoker: IConstruct, nodegroup_arns: list[str], encrypted_topic: bool, failed: IConstruct
) -> dict[IConstruct, dict[str, str]]:
    """The Capacity Block end function's, its scheduler role's and its failed-events queue's
    acknowledgments; ``nodegroup_arns``: the node groups' ARN patterns as cdk-nag names them
    (``token_names``)."""
    function_id = logical_id(function.node.default_child)
    found: dict[str, str] = {
        _LAMBDA_LOGS: (
            "The Capacity Block end Lambda writes only its own CloudWatch logs; this AWS managed policy is the "
            "documented minimum for that."
        ),
        f"{PACK}-IAM5[Resource::*]": (
            "ec2:DescribeCapacityReservations supports no resource-level permissions (Service Authorization "
            "Reference); it is read-only."
        ),
    }
    for arn in nodegroup_arns:
        found[f"{PACK}-IAM5[Resource::{arn}]"] = (
            "eks:DescribeNodegroup and UpdateNodegroupConfig on one Capacity Block node group of this cluster; "
            "the ARN's last part is an id EKS chooses at creation."
        )
    if encrypted_topic:
        found[f"{PACK}-IAM5[Action::kms:GenerateDataKey*]"] = (
            "Publishing to the alarms' KMS-encrypted SNS topic needs a data key of its key (aws-cdk-lib's grant "
            "on that one key)."
        )
    return {
        failed: {
            f"{PACK}-SQS3": (
                "This queue is itself the dead-letter queue: the function's on-failure destination and the schedules' "
                "DeadLetterConfig (cdk-nag only sees another queue's RedrivePolicy)."
            )
        },
        function: found,
        invoker: {
            f"{PACK}-IAM5[Resource::<{function_id}.Arn>:*]": (
                "aws-cdk-lib's invoke grant covers the versions of this one function (<function arn>:*)."
            )
        },
    }


def token_names(scope: IConstruct, value: str) -> str:
    """``value`` as cdk-nag names it in a finding: each Ref as ``<LogicalId>``, each GetAtt as
    ``<LogicalId.Attribute>``, the pseudo parameters as ``<AWS::Name>``."""
    resolved = Stack.of(scope).resolve(value)

    def name(part: Any) -> str:
        if isinstance(part, str):
            return part
        if "Ref" in part:
            return f"<{part['Ref']}>"
        if "Fn::GetAtt" in part:
            return f"<{'.'.join(part['Fn::GetAtt'])}>"
        if "Fn::Join" in part:
            return "".join(name(p) for p in part["Fn::Join"][1])
        raise ValueError(f"cannot name {part!r} as cdk-nag does")

    return name(resolved)


def provider_framework(provider: IConstruct, handler: IConstruct) -> dict[str, str]:
    """aws-cdk-lib's custom-resource Provider framework Lambda, which invokes ``handler``."""
    handler_id = logical_id(handler.node.default_child)
    return {
        _LAMBDA_LOGS: "aws-cdk-lib's Provider framework Lambda writes only its own CloudWatch logs.",
        f"{PACK}-IAM5[Resource::<{handler_id}.Arn>:*]": (
            "The Provider framework may invoke any version of its own handler function "
            "(<handler arn>:*); the wildcard covers versions of that one function only."
        ),
    }


def published_policy_wildcards(document: dict[str, Any], source: str) -> dict[str, str]:
    """IAM5 for every wildcard resource of a policy taken unchanged from an upstream release."""
    reason = (
        f"{source}, unchanged: Describe* and Get* have no resource-level permissions; mutating actions "
        "are conditioned on the elbv2.k8s.aws/cluster resource tag the controller sets."
    )
    found = {}
    for statement in document["Statement"]:
        resources = statement["Resource"]
        for resource in [resources] if isinstance(resources, str) else resources:
            if "*" in resource:
                found[f"{PACK}-IAM5[Resource::{resource}]"] = reason
    return found


API_KEYS_SECRET = {
    f"{PACK}-SMG4": (
        "The secret holds many keys, one per application; rotating means adding a key and removing the old "
        "one when its users have moved (docs/features/api-keys.md). A rotation Lambda replacing the value "
        "would revoke every application's key at once."
    ),
}


GCS_STORE_TOKEN = {
    f"{PACK}-SMG4": (
        "The Ray GCS reads the store's token once, when the head starts: a rotation would have to move "
        "ElastiCache through AuthTokenUpdateStrategy ROTATE and SET around a head restart. The token is "
        "generated at deploy, reachable only by the head's role, and the store admits only the cluster's "
        "security group over TLS."
    ),
}


MODEL_BUCKET_NO_ACCESS_LOGS = (
    "The model bucket holds model weights (a gated model's too, which its licence restricts: not public); "
    "only the staging job writes and only the Ray workers' role reads, under models/. Server access logs "
    "would need a second bucket that outlives the stack; CloudTrail S3 data events are the audit trail "
    "where one is required."
)
MODEL_BUCKET = {f"{PACK}-S1": MODEL_BUCKET_NO_ACCESS_LOGS}

WEIGHTS_FUNCTION = {
    _LAMBDA_LOGS: (
        "The weights-staging Lambdas write only their own CloudWatch logs; this AWS managed policy is "
        "the documented minimum for that."
    ),
}


def arn_prefix(scope: IConstruct, service: str) -> str:
    """``arn:partition:service:region:account`` as cdk-nag renders it in a finding: the pseudo
    parameters for an environment-agnostic stack, the literals for one with an explicit ``env``."""
    stack = Stack.of(scope)

    def shown(value: str, pseudo: str) -> str:
        return f"<AWS::{pseudo}>" if Token.is_unresolved(value) else value

    partition = shown(stack.partition, "Partition")
    return f"arn:{partition}:{service}:{shown(stack.region, 'Region')}:{shown(stack.account, 'AccountId')}"


def _stack_ids(*elements: IConstruct) -> list[str]:
    return [logical_id(e.node.default_child) for e in elements]


def staging_job(project: IConstruct, bucket: IConstruct) -> dict[str, str]:
    """The staging job's role: its own writes under the bucket's models/ prefix, and the grants
    aws-cdk-lib's CodeBuild Project adds for its log group and report groups."""
    (project_id, bucket_id) = _stack_ids(project, bucket)
    return {
        f"{PACK}-IAM5[Resource::<{bucket_id}.Arn>/models/*]": (
            "The job stages any revision of the served model under models/<repository>/<revision>/; the "
            "object keys are the files of that revision, unknown before it runs."
        ),
        f"{PACK}-IAM5[Resource::{arn_prefix(project, 'logs')}:log-group:/aws/codebuild/"
        f"<{project_id}>:*]": "aws-cdk-lib's CodeBuild grant: the project's own log streams.",
        f"{PACK}-IAM5[Resource::{arn_prefix(project, 'codebuild')}:report-group/"
        f"<{project_id}>-*]": "aws-cdk-lib's CodeBuild grant: the project's own report groups (unused).",
        **{
            f"{PACK}-IAM5[Action::{action}]": (
                "aws-cdk-lib's grants for the job's source (read of its code asset in the CDK asset bucket) and "
                "its encryption key (the stack's model key): action groups on those two resources only."
            )
            for action in ("s3:GetBucket*", "s3:GetObject*", "s3:List*", "kms:GenerateDataKey*", "kms:ReEncrypt*")
        },
    }


def weights_is_complete(bucket: IConstruct) -> dict[str, str]:
    (bucket_id,) = _stack_ids(bucket)
    return {
        **WEIGHTS_FUNCTION,
        f"{PACK}-IAM5[Resource::<{bucket_id}.Arn>/models/*]": (
            "Reads the staging job's one-line failure reason, which it writes beside the revision it stages."
        ),
    }


def _bucket_objects(bucket: IConstruct, prefix: str, reason: str) -> dict[str, str]:
    """IAM5 on ``<bucket>/<prefix>/*``, acknowledged for ``reason``."""
    (bucket_id,) = _stack_ids(bucket)
    return {f"{PACK}-IAM5[Resource::<{bucket_id}.Arn>/{prefix}/*]": reason}


def model_readers(bucket: IConstruct) -> dict[str, str]:
    return _bucket_objects(
        bucket,
        "models",
        "The Ray workers read the revisions this stack staged (the old one still serves until the new one is "
        "staged); the bucket holds nothing else but the engines' compile archives under compile/.",
    )


def compile_sharers(bucket: IConstruct) -> dict[str, str]:
    return _bucket_objects(
        bucket,
        "compile",
        "The GPU workers share compile archives keyed by image and engine settings under compile/ "
        "(shared_compile_cache); the keys are derived in the pods, one per engine settings.",
    )


def waiting_provider_framework(provider: IConstruct, on_event: IConstruct, is_complete: IConstruct) -> dict[str, str]:
    """aws-cdk-lib's Provider framework with an is_complete handler: three framework Lambdas and the
    Step Functions state machine that polls."""
    found = provider_framework(provider, on_event)
    names = {"framework-isComplete", "framework-onTimeout"}
    versions = "The Provider framework invokes any version of its own functions (<arn>:*), those only."
    for element in [is_complete, *(provider.node.find_child(n) for n in sorted(names))]:
        found[f"{PACK}-IAM5[Resource::<{logical_id(element.node.default_child)}.Arn>:*]"] = versions
    found[f"{PACK}-IAM5[Resource::*]"] = (
        "The state machine's log delivery, as aws-cdk-lib grants it: logs:CreateLogDelivery, GetLogDelivery, "
        "UpdateLogDelivery, DeleteLogDelivery, ListLogDeliveries, PutResourcePolicy, DescribeResourcePolicies "
        "and DescribeLogGroups support no resource-level permissions (Service Authorization Reference)."
    )
    found[f"{PACK}-SF2"] = (
        "aws-cdk-lib's Provider framework state machine only waits and polls; its executions are logged "
        "(level ALL) to a group of the stack, X-Ray would add nothing."
    )
    return found
