"""Before `cdk deploy`, with your AWS credentials: will the GPU nodes launch?

Resolves the GPU AZ (the first AZ of the region that offers the GPU instance type, which must
support EFA), checks the G and VT on-demand vCPU quota against gpu_node_count x vCPUs, checks
the CDK bootstrap stack, then writes the AZs into cdk.context.json so the next synth pins them.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import DeploymentConfig
from ._common import add_config_arguments, console, load_config, table

G_VT_QUOTA = ("ec2", "L-DB2E81BA")  # Running On-Demand G and VT instances (vCPUs)
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


def resolve_gpu_az(ec2: Any, config: DeploymentConfig, region: str) -> tuple[str, list[str]]:
    """The GPU AZ and the VPC's AZs (the GPU AZ first, then the next available one)."""
    zones = sorted(
        z["ZoneName"]
        for z in ec2.describe_availability_zones(
            Filters=[
                {"Name": "state", "Values": ["available"]},
                {"Name": "zone-type", "Values": ["availability-zone"]},
            ]
        )["AvailabilityZones"]
    )
    offered = {
        o["Location"]
        for o in ec2.describe_instance_type_offerings(
            LocationType="availability-zone",
            Filters=[{"Name": "instance-type", "Values": [config.gpu_instance_type]}],
        )["InstanceTypeOfferings"]
    }
    candidates = [z for z in zones if z in offered]
    if config.gpu_availability_zone:
        if config.gpu_availability_zone not in offered:
            raise PreflightFailed(
                f"gpu_availability_zone={config.gpu_availability_zone!r} does not offer {config.gpu_instance_type}. "
                f"Fix: use one of {', '.join(candidates) or '(none in ' + region + ')'}"
            )
        candidates = [config.gpu_availability_zone]
    if not candidates:
        raise PreflightFailed(
            f"{config.gpu_instance_type} is not offered in any AZ of {region}. Fix: deploy to another "
            "region (--region) or choose another gpu_instance_type"
        )
    gpu_az = candidates[0]
    others = [z for z in zones if z != gpu_az]
    if not others:
        raise PreflightFailed(f"{region} has only one available AZ; EKS needs two. Fix: choose another region")
    return gpu_az, [gpu_az, others[0]]


def instance_facts(ec2: Any, instance_type: str) -> tuple[int, bool]:
    (info,) = ec2.describe_instance_types(InstanceTypes=[instance_type])["InstanceTypes"]
    return int(info["VCpuInfo"]["DefaultVCpus"]), bool(info["NetworkInfo"].get("EfaSupported"))


def check(ec2: Any, quotas: Any, cloudformation: Any, config: DeploymentConfig, region: str) -> Result:
    from botocore.exceptions import ClientError

    result = Result(region=region)
    vcpus, efa = instance_facts(ec2, config.gpu_instance_type)
    result.checks.append(("EFA support", efa, f"{config.gpu_instance_type} EfaSupported={efa}"))
    if not efa:
        raise PreflightFailed(
            f"{config.gpu_instance_type} does not support EFA in {region}. Fix: choose a GPU type with EFA"
        )
    result.gpu_az, result.availability_zones = resolve_gpu_az(ec2, config, region)
    result.checks.append(("GPU AZ", True, f"{result.gpu_az} offers {config.gpu_instance_type}"))

    needed = config.gpu_node_count * vcpus
    service, code = G_VT_QUOTA
    try:
        quota = float(quotas.get_service_quota(ServiceCode=service, QuotaCode=code)["Quota"]["Value"])
    except ClientError:
        quota = float(quotas.get_aws_default_service_quota(ServiceCode=service, QuotaCode=code)["Quota"]["Value"])
    fix = "" if quota >= needed else f" Fix: request {needed:.0f} vCPUs for quota {code} in Service Quotas"
    result.checks.append(("G/VT vCPU quota", quota >= needed, f"{quota:.0f} available, {needed} needed "
                          f"({config.gpu_node_count} x {vcpus} vCPUs).{fix}"))  # fmt: skip

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
