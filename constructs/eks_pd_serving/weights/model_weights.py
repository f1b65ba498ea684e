"""The model's weights in the stack's own bucket: staged once per revision by a CodeBuild job the
deploy waits for, then read by the engines through the VPC's S3 gateway endpoint (no NAT bytes).

Why CodeBuild: the job runs to completion outside the cluster and outside the VPC (its traffic to
Hugging Face crosses no NAT), its disk holds one shard at a time, it can take hours (Lambda
stops at 15 minutes), its log is a CloudWatch log group of the stack, and a custom resource can
wait for it and fail the deploy with the job's one-line reason. An in-cluster Job would need a
GPU-free node, a way to wait from CloudFormation, and the NAT.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from aws_cdk import Annotations, CustomResource, Duration, RemovalPolicy
from aws_cdk import aws_codebuild as codebuild
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import custom_resources as cr
from constructs import Construct

from .._private import checkov, nag
from .._private.kms import rotating_key
from ..log_groups import LogGroups
from .node_cache import COMPILE_PREFIX

JOB_DIR = Path(__file__).parent / "job"
HANDLER_DIR = Path(__file__).parent / "handler"
RESOURCE_TYPE = "Custom::ModelWeights"
# The staging job's own Python packages (CodeBuild installs them from PyPI at each run).
JOB_PACKAGES = ("huggingface_hub==2.4.0", "boto3==1.44.8")
# CloudFormation waits for a custom resource at most one hour (ServiceTimeout <= 3,600 s; the
# Provider's totalTimeout doc says so and does not enforce it, aws/aws-cdk#24974). The waiter gives
# up before that, and the job stops at the same limit, so a failed wait leaves no build running.
STAGING_TIMEOUT = Duration.minutes(55)
CLOUDFORMATION_WAIT = Duration.hours(1)
_OUTSIDE_VPC = "Calls only CodeBuild and S3 APIs; no ENI to release on destroy"


WEIGHTS_PREFIX = "models"
# The engines' compile archives (``share_compile_caches``, under the node cache's COMPILE_PREFIX)
# expire this long after their upload: a node of a newer image or other settings compiles and
# shares its own, and an archive still in use is shared again by the next node that compiles it.
COMPILE_EXPIRY = Duration.days(30)


def weights_prefix(model_source: str, revision: str) -> str:
    """Where a revision lives in the bucket: one prefix per model and revision setting."""
    return f"{WEIGHTS_PREFIX}/{model_source}/{revision}"


# What ``cdk destroy`` does to the bucket and its key (the setting ``model_bucket_removal``).
Removal = Literal["destroy", "retain"]


class ModelWeights(Construct):
    """The bucket, the staging job and the custom resource that runs it.

    :param model_source: the Hugging Face repository.
    :param revision: its revision (a commit hash pins it; a branch or tag is resolved when staged).
    :param log_groups: where the job and the Lambdas log.
    :param hf_token_secret: name or ARN of a Secrets Manager secret holding a Hugging Face token;
        only the job reads it. Default: none (public models).
    :param removal: ``destroy`` empties and deletes the bucket and its key with the stack;
        ``retain`` keeps both. Default: destroy.
    :param access_logs: a bucket of the user's and a prefix there for the bucket's server access
        logs (S3 delivers them; the target's bucket policy must admit ``logging.s3.amazonaws.com``).
        Default: none.
    :param more: further models to stage, each (model id, repository, revision): one custom resource
        each (``Resource-<model id>``), run by the same job and provider, so each revision is staged
        once and the deploy waits for all. Default: () (the first model alone).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        model_source: str,
        revision: str,
        log_groups: LogGroups,
        hf_token_secret: str | None = None,
        removal: Removal = "destroy",
        access_logs: tuple[s3.IBucket, str] | None = None,
        more: Sequence[tuple[str, str, str]] = (),
    ) -> None:
        super().__init__(scope, id)
        destroy = removal == "destroy"
        self.prefix = weights_prefix(model_source, revision)
        self.key = rotating_key(self, "Key", "Encryption of the model weights bucket")
        if not destroy:
            self.key.apply_removal_policy(RemovalPolicy.RETAIN)
        self.bucket = s3.Bucket(
            self,
            "Bucket",
            encryption=s3.BucketEncryption.KMS,
            encryption_key=self.key,
            bucket_key_enabled=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            enforce_ssl=True,
            removal_policy=RemovalPolicy.DESTROY if destroy else RemovalPolicy.RETAIN,
            auto_delete_objects=destroy,
            server_access_logs_bucket=access_logs[0] if access_logs else None,
            server_access_logs_prefix=access_logs[1] if access_logs else None,
        )
        if access_logs is None:
            nag.acknowledge(self.bucket, nag.MODEL_BUCKET)
        else:  # the target is the user's bucket: its policy is theirs (preflight checks it)
            Annotations.of(self.bucket).acknowledge_warning(
                "@aws-cdk/aws-s3:accessLogsPolicyNotAdded",
                "access_logs_bucket is the user's; preflight checks its policy",
            )
        if not destroy and self.bucket.policy is not None:
            # A retained bucket keeps its guard: the TLS-only policy outlives the stack with it.
            self.bucket.policy.apply_removal_policy(RemovalPolicy.RETAIN)
        if destroy:  # aws-cdk-lib's bucket emptier (a stack-level provider) calls only S3
            checkov.skip_stack_provider(
                self, "Custom::S3AutoDeleteObjects", checkov.LAMBDA_OUTSIDE_VPC, "Calls only the S3 API on destroy"
            )
        bucket_cfn = self.bucket.node.default_child
        assert isinstance(bucket_cfn, s3.CfnBucket)
        if access_logs is None:
            checkov.skip(bucket_cfn, checkov.S3_ACCESS_LOGGING, nag.MODEL_BUCKET_NO_ACCESS_LOGS)
        checkov.skip(
            bucket_cfn,
            checkov.S3_VERSIONING,
            "Weights are re-staged from Hugging Face; versions would double the storage",
        )
        self.project = self._job(log_groups, hf_token_secret)
        self._provider = self._staging(log_groups)
        self.resource = self._stage("Resource", model_source, revision)
        #: The further models' staged copies by model id: (``s3://bucket/prefix``, its custom resource).
        self.more: dict[str, tuple[str, CustomResource]] = {}
        for model_id, source, model_revision in more:
            resource = self._stage(f"Resource-{model_id}", source, model_revision)
            self.more[model_id] = (f"s3://{self.bucket.bucket_name}/{weights_prefix(source, model_revision)}", resource)

    def _job(self, log_groups: LogGroups, hf_token_secret: str | None) -> codebuild.Project:
        source = s3_assets.Asset(self, "JobCode", path=str(JOB_DIR), exclude=["__pycache__", "*.pyc", "__init__.py"])
        env: dict[str, codebuild.BuildEnvironmentVariable] = {
            "BUCKET": codebuild.BuildEnvironmentVariable(value=self.bucket.bucket_name),
        }
        if hf_token_secret:
            # The job's environment gets the secret's value at run time; the template holds its name.
            env["HF_TOKEN"] = codebuild.BuildEnvironmentVariable(
                type=codebuild.BuildEnvironmentVariableType.SECRETS_MANAGER, value=hf_token_secret
            )
        project = codebuild.Project(
            self,
            "Job",
            description="Stages the model's weights from Hugging Face into the stack's bucket, once per revision",
            source=codebuild.Source.s3(bucket=source.bucket, path=source.s3_object_key),
            environment=codebuild.BuildEnvironment(
                build_image=codebuild.LinuxBuildImage.AMAZON_LINUX_2023_5, compute_type=codebuild.ComputeType.LARGE
            ),
            environment_variables=env,
            build_spec=codebuild.BuildSpec.from_object(
                {
                    "version": "0.2",
                    "phases": {
                        "install": {"commands": [f"python3 -m pip install --quiet {' '.join(JOB_PACKAGES)}"]},
                        "build": {"commands": ["python3 stage.py"]},
                    },
                }
            ),
            encryption_key=self.key,
            timeout=STAGING_TIMEOUT,
            logging=codebuild.LoggingOptions(
                cloud_watch=codebuild.CloudWatchLoggingOptions(log_group=log_groups.group(self, "JobLogGroup"))
            ),
        )
        # The job writes under models/ only (every revision of every model this stack serves).
        project.add_to_role_policy(
            iam.PolicyStatement(
                actions=["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
                resources=[self.bucket.arn_for_objects(f"{WEIGHTS_PREFIX}/*")],
            )
        )
        # Its first call probes the .staged marker, which a first deploy lacks: without ListBucket S3
        # answers that missing key 403 AccessDenied, not 404 (S3 API reference, GetObject).
        project.add_to_role_policy(self._list_models())
        self.key.grant(project, "kms:Decrypt", "kms:GenerateDataKey")
        nag.acknowledge(project, nag.staging_job(project, self.bucket))
        return project

    def _staging(self, log_groups: LogGroups) -> cr.Provider:
        """The handlers that start the job and poll it, and their provider (one for every revision)."""
        function = self._handler(log_groups, "Function", "on_event", "Starts the weights-staging job and waits for it")
        complete = self._handler(log_groups, "IsComplete", "is_complete", "Polls the weights-staging job")
        # Delete (a rollback included) stops the project's builds still running: nothing staged on, billed.
        function.add_to_role_policy(
            iam.PolicyStatement(
                actions=[
                    "codebuild:StartBuild",
                    "codebuild:ListBuildsForProject",
                    "codebuild:BatchGetBuilds",
                    "codebuild:StopBuild",
                ],
                resources=[self.project.project_arn],
            )
        )
        complete.add_to_role_policy(
            iam.PolicyStatement(actions=["codebuild:BatchGetBuilds"], resources=[self.project.project_arn])
        )
        # The job's one-line reason, when it failed.
        complete.add_to_role_policy(
            iam.PolicyStatement(
                actions=["s3:GetObject"], resources=[self.bucket.arn_for_objects(f"{WEIGHTS_PREFIX}/*")]
            )
        )
        # A job that died before writing its reason leaves no object: 404 (its log), not 403.
        complete.add_to_role_policy(self._list_models())
        self.key.grant(complete, "kms:Decrypt")
        provider = cr.Provider(
            self,
            "Provider",
            on_event_handler=function,
            is_complete_handler=complete,
            query_interval=Duration.seconds(30),
            total_timeout=STAGING_TIMEOUT,
            log_group=log_groups.group(self, "ProviderLogGroup"),
            disable_waiter_state_machine_logging=False,
            waiter_state_machine_log_options=cr.LogOptions(
                destination=log_groups.group(self, "WaiterLogGroup"), level=sfn.LogLevel.ALL
            ),
        )
        nag.acknowledge(function, nag.WEIGHTS_FUNCTION)
        nag.acknowledge(complete, nag.weights_is_complete(self.bucket))
        # The two handlers and the provider's framework functions: all outside the VPC.
        for fn in (*function.node.find_all(), *complete.node.find_all(), *provider.node.find_all()):
            if isinstance(fn, lambda_.CfnFunction):
                checkov.skip(fn, checkov.LAMBDA_OUTSIDE_VPC, _OUTSIDE_VPC)
        nag.acknowledge(provider, nag.waiting_provider_framework(provider, function, complete))
        waiter_policy = provider.node.find_child("waiter-state-machine").node.find_child("Role")
        policy = waiter_policy.node.find_child("DefaultPolicy").node.default_child
        assert isinstance(policy, iam.CfnPolicy)
        checkov.skip(
            policy,
            checkov.IAM_WRITE_WITHOUT_CONSTRAINTS,
            "aws-cdk-lib's state machine log delivery (logs:CreateLogDelivery and the rest support no resource-level "
            "permissions)",
        )
        return provider

    def _stage(self, id: str, model_source: str, revision: str) -> CustomResource:
        """One revision staged: the custom resource the deploy waits for."""
        return CustomResource(
            self,
            id,
            service_token=self._provider.service_token,
            resource_type=RESOURCE_TYPE,
            service_timeout=CLOUDFORMATION_WAIT,
            properties={
                "ProjectName": self.project.project_name,
                "Bucket": self.bucket.bucket_name,
                "Prefix": weights_prefix(model_source, revision),
                "Model": model_source,
                "Revision": revision,
            },
        )

    def _list_models(self) -> iam.PolicyStatement:
        """ListBucket on the bucket: what turns a missing key's 403 into 404. No ``s3:prefix``
        condition: a GetObject request carries no prefix, so a conditioned grant would not count."""
        return iam.PolicyStatement(actions=["s3:ListBucket"], resources=[self.bucket.bucket_arn])

    def _handler(self, log_groups: LogGroups, id: str, entry: str, description: str) -> lambda_.Function:
        """One of the custom resource's two handlers (handler/handler.py), logging to a group of ours."""
        return lambda_.Function(
            self,
            id,
            description=description,
            runtime=lambda_.Runtime.PYTHON_3_14,
            handler=f"handler.{entry}",
            code=lambda_.Code.from_asset(str(HANDLER_DIR), exclude=["__pycache__", "*.pyc", "__init__.py"]),
            timeout=Duration.minutes(1),
            log_group=log_groups.group(self, f"{id}LogGroup"),
        )

    def grant_read(self, grantee: iam.IGrantable) -> iam.Grant:
        """Read every revision staged under ``models/``: list it, get its objects, decrypt through S3.

        Not the current revision's prefix alone: a ``model_revision`` change updates this policy in
        the update's first wave, but the serve config moves to the new prefix only once the new
        revision is staged (minutes to an hour later); every engine start in between (a restart, a
        replaced node, a scale-up) still reads the old prefix. The bucket holds nothing else: only
        the weights this stack staged.
        """
        principal = grantee.grant_principal
        principal.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["s3:GetObject"], resources=[self.bucket.arn_for_objects(f"{WEIGHTS_PREFIX}/*")]
            )
        )
        principal.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["s3:ListBucket"],
                resources=[self.bucket.bucket_arn],
                conditions={"StringLike": {"s3:prefix": [f"{WEIGHTS_PREFIX}/*", WEIGHTS_PREFIX]}},
            )
        )
        return self.key.grant(grantee, "kms:Decrypt")

    def share_compile_caches(self, grantee: iam.IGrantable) -> None:
        """Let ``grantee`` (the GPU workers) read and write the compile archives under ``compile/``:
        get and put (the node cache's conditional write; S3 never overwrites an archive), list the
        bucket (a missing archive is then 404, not 403: S3 checks ``s3:ListBucket`` for a missing key
        without an ``s3:prefix``, so a prefix-conditioned grant does not count; the names it lists are
        of the weights the workers read anyway), encrypt and decrypt through S3. No write under
        ``models/``. Archives expire ``COMPILE_EXPIRY`` after their upload."""
        principal = grantee.grant_principal
        principal.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["s3:GetObject", "s3:PutObject"],
                resources=[self.bucket.arn_for_objects(f"{COMPILE_PREFIX}/*")],
            )
        )
        principal.add_to_principal_policy(
            iam.PolicyStatement(actions=["s3:ListBucket"], resources=[self.bucket.bucket_arn])
        )
        self.key.grant(grantee, "kms:Decrypt", "kms:GenerateDataKey")
        self.bucket.add_lifecycle_rule(id="CompileCaches", prefix=f"{COMPILE_PREFIX}/", expiration=COMPILE_EXPIRY)

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket.bucket_name}/{self.prefix}"
