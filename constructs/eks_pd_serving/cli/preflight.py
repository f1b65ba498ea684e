"""Before `cdk deploy`, with your AWS credentials: will the GPU nodes launch?

Resolves the GPU AZ (the first AZ of the region that offers every GPU group's instance type),
runs the checks the deploy-time custom resource runs (EFA support of each type, the AZ's
offering, each family's on-demand vCPU quota, G and VT or P, less the vCPUs already running
against its GPU groups' need), compares each GPU type's catalogue row with EC2's
DescribeInstanceTypes (vCPUs, memory, GPUs, GPU memory, EFA interfaces), checks the CDK bootstrap
stack, that none of the log groups the stack creates under fixed names exists yet and, with
observability, that EKS offers the pinned CloudWatch add-on version for the Kubernetes version and
accepts the stack's configuration values (the add-on's own JSON schema, from EKS), with
``access_logs_bucket`` that the bucket is in the region and admits the log writers, then writes the
AZs into cdk.context.json so the next synth pins them.
"""

from __future__ import annotations

import argparse
import datetime
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..capacity.checks import block_times, check_capacity, offered_azs
from ..capacity.checks import check_reservations as reservation_checks
from ..catalog import INSTANCE_TYPES, mismatches
from ..config import DeploymentConfig, derived
from ..lifecycle.needs import named_log_groups
from ..observability import ADDON_NAME, addon_configuration
from ._common import add_config_arguments, console, load_config, table

BOOTSTRAP_STACK = "CDKToolkit"


class PreflightFailed(RuntimeError):
    """One line: what is wrong and the fix."""


@dataclass
class Result:
    region: str
    gpu_az: str = ""
    availability_zones: list[str] = field(default_factory=list)
    checks: list[tuple[str, bool, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(passed for _, passed, _ in self.checks)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.add_argument("--region", help="AWS region (default: the region setting, then your AWS config)")
    parser.add_argument("--profile", help="AWS profile")
    parser.add_argument("--no-write", action="store_true", help="do not write cdk.context.json")
    parser.add_argument("--block-hours", type=block_hours, default=None, metavar="HOURS",
                        help="also list the Capacity Block offerings of each GPU group's type and most nodes in the "
                             "GPU AZ for this duration, with their price (DescribeCapacityBlockOfferings)")  # fmt: skip


def block_hours(text: str) -> int:
    """A Capacity Block duration EC2 sells: whole days up to 14, then whole weeks up to 182 days."""
    hours = int(text) if text.isdigit() else -1
    if (24 <= hours <= 14 * 24 and hours % 24 == 0) or (14 * 24 < hours <= 182 * 24 and hours % (7 * 24) == 0):
        return hours
    raise argparse.ArgumentTypeError(
        f"--block-hours={text!r} is not a Capacity Block duration. Fix: 24 to 336 in steps of 24 (1-14 days), "
        "or 504 to 4368 in steps of 168 (3-26 weeks)"
    )


def block_offerings(ec2: Any, config: DeploymentConfig, gpu_az: str, hours: int) -> list[tuple[str, bool, str]]:
    """The cheapest Capacity Block offering in the GPU AZ for each GPU group (its type, its most
    nodes, ``hours``), with its price per instance-hour; informational (never fails preflight)."""
    rows = []
    for group in config.gpu_groups:
        name = f"Capacity Block offering ({group.name})"
        pages = ec2.get_paginator("describe_capacity_block_offerings").paginate(
            InstanceType=group.instance_type, InstanceCount=group.max_node_count, CapacityDurationHours=hours
        )
        offers = [o for page in pages for o in page["CapacityBlockOfferings"]]
        here = sorted((o for o in offers if o["AvailabilityZone"] == gpu_az), key=lambda o: float(o["UpfrontFee"]))
        if not here:
            elsewhere = sorted({o["AvailabilityZone"] for o in offers}) or ["no AZ"]
            rows.append((name, True, f"none of {group.max_node_count} x {group.instance_type} for {hours} h in "
                         f"{gpu_az} (offered in {', '.join(elsewhere)})"))  # fmt: skip
            continue
        best = here[0]
        fee, count = float(best["UpfrontFee"]), int(best["InstanceCount"])
        per_hour = fee / int(best["CapacityBlockDurationHours"]) / count
        window = f"{best['StartDate'].isoformat()} to {best['EndDate'].isoformat()}"
        price = f"{best.get('CurrencyCode', 'USD')} {fee:,.2f} up front = {per_hour:.4f} per instance-hour"
        offer = f"{best['CapacityBlockOfferingId']}: {count} x {group.instance_type} in {gpu_az}, {window}, {price}"
        rows.append((name, True, f"{offer} (cost --capacity-block-price {per_hour:.4f})"))
    return rows


def resolve_gpu_az(ec2: Any, config: DeploymentConfig, region: str) -> tuple[str, list[str]]:
    """The GPU AZ (the first AZ that offers every GPU group's type, or the one pinned) and the
    VPC's AZs (the GPU AZ first, then the next available one)."""
    zones = sorted(
        z["ZoneName"]
        for z in ec2.describe_availability_zones(
            Filters=[
                {"Name": "state", "Values": ["available"]},
                {"Name": "zone-type", "Values": ["availability-zone"]},
            ]
        )["AvailabilityZones"]
    )
    types = sorted({group.instance_type for group in config.gpu_groups})
    offered = set(zones)
    for instance_type in types:
        offered &= set(offered_azs(ec2, instance_type))
    candidates = [z for z in zones if z in offered]
    wanted = " and ".join(types)
    if config.gpu_availability_zone:
        if config.gpu_availability_zone not in offered:
            raise PreflightFailed(
                f"gpu_availability_zone={config.gpu_availability_zone!r} does not offer {wanted}. "
                f"Fix: use one of {', '.join(candidates) or '(none in ' + region + ')'}"
            )
        candidates = [config.gpu_availability_zone]
    if not candidates:
        raise PreflightFailed(
            f"no AZ of {region} offers {wanted}. Fix: deploy to another region (--region) or choose other GPU "
            "instance types"
        )
    gpu_az = candidates[0]
    others = [z for z in zones if z != gpu_az]
    if not others:
        raise PreflightFailed(f"{region} has only one available AZ; EKS needs two. Fix: choose another region")
    return gpu_az, [gpu_az, others[0]]


def check_cloudwatch_addon(eks: Any, config: DeploymentConfig, region: str) -> tuple[str, bool, str]:
    """Is ``cloudwatch_addon_version`` offered for ``kubernetes_version``, and do the stack's
    configuration values validate against that version's schema? A wrong pin or a value the
    add-on does not know fails the deploy after the cluster exists (about 20 minutes in)."""
    import jsonschema

    name, version, kubernetes = "CloudWatch add-on", config.cloudwatch_addon_version, config.kubernetes_version
    offered: list[str] = []
    for page in eks.get_paginator("describe_addon_versions").paginate(
        addonName=ADDON_NAME, kubernetesVersion=kubernetes
    ):
        offered += [v["addonVersion"] for addon in page["addons"] for v in addon["addonVersions"]]
    if version not in offered:
        newest = ", ".join(offered[:3]) + (", ..." if len(offered) > 3 else "") or "none"
        return (
            name,
            False,
            f"{ADDON_NAME} {version} is not offered for Kubernetes {kubernetes} in {region} (offered: {newest}). "
            "Fix: set cloudwatch_addon_version to one of them",
        )
    schema = json.loads(
        eks.describe_addon_configuration(addonName=ADDON_NAME, addonVersion=version)["configurationSchema"]
    )
    values = addon_configuration(cluster_name=config.cluster_name, region=region, namespace=config.namespace)
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(values), key=lambda e: list(e.absolute_path))
    if errors:
        where = "/".join(map(str, errors[0].absolute_path)) or "(top)"
        return (
            name,
            False,
            f"{version} refuses the stack's configuration values at {where}: {errors[0].message}. "
            "Fix: set cloudwatch_addon_version to a version whose schema has it, or observability=false",
        )
    return name, True, f"{ADDON_NAME} {version} is offered for {kubernetes} and accepts the stack's values"


def check_instance_facts(ec2: Any, config: DeploymentConfig) -> list[tuple[str, bool, str]]:
    """Does each GPU type's catalogue row (what sizing, the launch template's EFA layout and the
    pods' requests were built from) agree with what EC2 says of it here?"""
    wanted = sorted({group.instance_type for group in config.gpu_groups})
    live = {
        info["InstanceType"]: info
        for page in ec2.get_paginator("describe_instance_types").paginate(InstanceTypes=wanted)
        for info in page["InstanceTypes"]
    }
    checks = []
    for name in wanted:
        found = mismatches(INSTANCE_TYPES[name], live[name])
        detail = (
            f"{'; '.join(found)}. Fix: correct its row in catalog/instances.py and synth again"
            if found
            else "vCPUs, memory, GPUs, GPU memory and EFA interfaces agree with the catalogue"
        )
        checks.append((f"Instance facts ({name})", not found, detail))
    return checks


def check_log_groups(logs: Any, config: DeploymentConfig) -> tuple[str, bool, str]:
    """Does a log group the stack creates under a fixed name exist already? CloudFormation then
    fails the first deploy (the control-plane group before the cluster, the add-on's after it)."""
    found = []
    for name in named_log_groups(config.cluster_name, observability=config.observability):
        groups = logs.describe_log_groups(logGroupNamePrefix=name)["logGroups"]
        found += [g["logGroupName"] for g in groups if g["logGroupName"] == name]
    if found:
        return (
            "Log groups",
            False,
            f"{', '.join(found)} already exist{'s' if len(found) == 1 else ''} and the stack creates "
            f"{'it' if len(found) == 1 else 'them'}. Fix: delete {'it' if len(found) == 1 else 'them'} "
            "(aws logs delete-log-group --log-group-name <name>, after exporting what you keep), or choose "
            "another cluster_name",
        )
    return "Log groups", True, "none of the stack's named log groups exists yet"


def check_reservations(
    ec2: Any, config: DeploymentConfig, gpu_az: str, now: datetime.datetime | None = None
) -> list[tuple[str, bool, str]]:
    """Each reserved GPU group's reservation against the group (``capacity.checks.check_reservations``,
    which the deploy-time check runs too), and each Capacity Block's end: when the group scales to
    zero and when the warning goes out."""
    now = now or datetime.datetime.now(datetime.UTC)
    checks, ends = reservation_checks(
        ec2, derived.reserved_groups(config), gpu_az, cluster_name=config.cluster_name, now=now
    )
    rows = [(check.name, check.passed, check.detail) for check in checks]
    for group, end in ends.items():
        scale_down, warn = block_times(end, now)
        rows.append(
            (
                f"Capacity Block end ({group})",
                True,
                f"ends {end.isoformat()}: the group scales to zero at {scale_down.isoformat()}, "
                f"the warning goes out at {warn.isoformat()}",
            )
        )
    return rows


# Who writes access logs into a bucket (its policy must allow them s3:PutObject there): S3 for a
# bucket's server access logs, the log delivery service for an NLB's (Elastic Load Balancing guide,
# "Enable access logs for your Network Load Balancer").
LOG_WRITERS = {"s3": "logging.s3.amazonaws.com", "nlb": "delivery.logs.amazonaws.com"}


def access_log_sources(config: DeploymentConfig) -> list[str]:
    """What logs into ``access_logs_bucket`` with these settings (see PdServing)."""
    found = ["s3"] if config.weights_source == "s3" else []
    if config.internal_endpoint and config.tls_certificate_arn:
        found.append("nlb")
    return found


def _allowed_writers(policy: dict[str, Any]) -> set[str]:
    """Service principals the policy allows s3:PutObject (any resource in the bucket)."""
    found: set[str] = set()
    for statement in policy.get("Statement", []):
        actions = statement.get("Action", [])
        actions = [actions] if isinstance(actions, str) else actions
        if statement.get("Effect") != "Allow" or not {"s3:PutObject", "s3:*", "*"} & set(actions):
            continue
        services = (
            (statement.get("Principal") or {}).get("Service", [])
            if isinstance(statement.get("Principal"), dict)
            else []
        )
        found |= {services} if isinstance(services, str) else set(services)
    return found


def check_access_logs_bucket(s3: Any, config: DeploymentConfig, region: str) -> tuple[str, bool, str]:
    """Is ``access_logs_bucket`` in this region, and does its policy let each writer in? S3 and
    ELB take the setting at deploy time and fail (or write nothing) later, where nobody looks."""
    from botocore.exceptions import ClientError

    bucket = config.access_logs_bucket
    name = "Access logs bucket"
    try:
        # us-east-1 answers with no constraint, and the oldest buckets in eu-west-1 with "EU".
        location = s3.get_bucket_location(Bucket=bucket).get("LocationConstraint") or "us-east-1"
    except ClientError as error:
        code = error.response["Error"]["Code"]
        return name, False, f"{bucket}: {code}. Fix: create it in {region}, or name a bucket of this account there"
    location = "eu-west-1" if location == "EU" else location
    if location != region:
        return name, False, f"{bucket} is in {location}, the stack in {region}. Fix: name a bucket in {region}"
    try:
        policy = json.loads(s3.get_bucket_policy(Bucket=bucket)["Policy"])
    except ClientError as error:
        if error.response["Error"]["Code"] != "NoSuchBucketPolicy":
            raise
        policy = {}
    missing = [LOG_WRITERS[s] for s in access_log_sources(config) if LOG_WRITERS[s] not in _allowed_writers(policy)]
    if missing:
        return (
            name,
            False,
            f"{bucket}'s policy does not allow {' or '.join(missing)} s3:PutObject. Fix: add the statements in "
            "docs/features/security.md#access-logs",
        )
    writers = ", ".join(LOG_WRITERS[s] for s in access_log_sources(config))
    return name, True, f"{bucket} is in {region} and its policy lets {writers} write"


def check(
    ec2: Any,
    quotas: Any,
    cloudformation: Any,
    config: DeploymentConfig,
    region: str,
    eks: Any | None = None,
    logs: Any | None = None,
    s3: Any | None = None,
) -> Result:
    """The deploy-time capacity checks (``capacity.checks``, the same code), on the AZ this
    resolves, then the CDK bootstrap stack, the named log groups (``logs`` given) and (``eks``
    given, with observability) the add-on."""
    from botocore.exceptions import ClientError

    result = Result(region=region)
    result.gpu_az, result.availability_zones = resolve_gpu_az(ec2, config, region)
    for found in check_capacity(
        ec2,
        quotas,
        [g.need for g in config.gpu_groups],
        result.gpu_az,
        cluster_name=config.cluster_name,
        reserved=derived.reserved_groups(config),
    ):
        result.checks.append((found.name, found.passed, found.detail))
    result.checks += check_instance_facts(ec2, config)
    result.checks += check_reservations(ec2, config, result.gpu_az)
    try:
        cloudformation.describe_stacks(StackName=BOOTSTRAP_STACK)
        result.checks.append(("CDK bootstrap", True, f"{BOOTSTRAP_STACK} exists"))
    except ClientError:
        result.checks.append(
            (
                "CDK bootstrap",
                False,
                f"no {BOOTSTRAP_STACK} stack. Fix: cdk bootstrap aws://<account>/{region}",
            )
        )
    if logs is not None:
        result.checks.append(check_log_groups(logs, config))
    if eks is not None and config.observability:
        result.checks.append(check_cloudwatch_addon(eks, config, region))
    if s3 is not None and config.access_logs_bucket:
        result.checks.append(check_access_logs_bucket(s3, config, region))
    return result


def write_context(project: Path, result: Result) -> Path:
    path = project / "cdk.context.json"
    context = json.loads(path.read_text()) if path.exists() else {}
    context.update(
        region=result.region,
        availability_zones=result.availability_zones,
        gpu_availability_zone=result.gpu_az,
    )
    path.write_text(json.dumps(context, indent=2, sort_keys=True) + "\n")
    return path


def run(args: argparse.Namespace) -> int:
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, NoRegionError

    config = load_config(args)
    try:
        session = boto3.Session(profile_name=args.profile, region_name=args.region or config.region)
        region = session.region_name
        if not region:
            raise PreflightFailed("no AWS region. Fix: pass --region, set AWS_REGION, or set the region setting")
        if config.region and config.region != region:
            raise PreflightFailed(f"--region {region} differs from region={config.region!r}. Fix: use one of them")
        result = check(
            session.client("ec2"),
            session.client("service-quotas"),
            session.client("cloudformation"),
            config,
            region,
            eks=session.client("eks"),
            logs=session.client("logs"),
            s3=session.client("s3"),
        )
    except PreflightFailed as error:
        console.print(f"preflight failed: {error}")
        return 1
    except (NoCredentialsError, NoRegionError) as error:
        console.print(f"preflight failed: {error}. Fix: run `aws configure` or set AWS_PROFILE / AWS_REGION")
        return 1
    except (ClientError, BotoCoreError) as error:
        console.print(f"preflight failed: {error}")
        return 1
    if args.block_hours:
        try:
            result.checks += block_offerings(session.client("ec2"), config, result.gpu_az, args.block_hours)
        except (ClientError, BotoCoreError) as error:
            result.checks.append(("Capacity Block offerings", False, f"unreadable ({error})"))
    rows = [
        [name, "[green]ok[/green]" if passed else "[red]FAIL[/red]", detail] for name, passed, detail in result.checks
    ]
    console.print(table(f"Preflight ({region})", ["check", "result", "detail"], rows))
    if result.ok and not args.no_write:
        path = write_context(args.project, result)
        console.print(
            f"wrote region, availability_zones={result.availability_zones}, "
            f"gpu_availability_zone={result.gpu_az} to {path}"
        )
    return 0 if result.ok else 1
