"""Hourly and 30-day cost estimate of what the synthesized app runs (an estimate, not a quote).

Reads the template `cdk synth` wrote (NAT gateways, node groups and their volumes, the EKS
version, the observability add-on, dashboard and alarms) and prices it from the table below.
Data transfer (NAT per-GB, cross-AZ), log ingestion, Container Insights observations and the
OpenTelemetry metrics sent over OTLP (latency and NIXL histograms, billed per GB ingested) depend on
traffic and on the number of pods, and are not included.
"""

from __future__ import annotations

import argparse
import datetime
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..assembly import kubernetes_objects
from ..catalog import MODELS
from ..catalog.prices import INSTANCE_PRICES, PRICES_SOURCE
from ..endpoint import proxy
from ..observability import ADDON_NAME, custom_metric_count
from ..versions import EKS_STANDARD_SUPPORT_ENDS
from ._common import console, table

VALKEY_NODE_PRICES: dict[str, float] = {
    "cache.t4g.micro": 0.0128, "cache.t4g.small": 0.0256, "cache.t4g.medium": 0.052,
    "cache.m7g.large": 0.1264, "cache.r7g.large": 0.1752,
}  # fmt: skip
PRICES: dict[str, dict[str, float]] = {
    "us-east-1": {
        **INSTANCE_PRICES,
        "eks_hour": 0.10,
        "eks_extended_hour": 0.60,
        "nat_hour": 0.045,
        "nat_gb": 0.045,
        "gp3_gb_month": 0.08,
        # gp3 throughput above the included 125 MiB/s (public pricing page, as recalled: not fetched here).
        "gp3_mibs_month": 0.04,
        "s3_gb_month": 0.023,  # S3 Standard, first 50 TB (public pricing page, as recalled: not fetched here)
        "kms_key_month": 1.00,
        # Secrets Manager (public pricing page, as recalled: not fetched here).
        "secret_month": 0.40,
        "secret_calls_10k": 0.05,
        # CloudWatch, standard resolution (public pricing page, as recalled: not fetched here).
        "cw_dashboard_month": 3.00,
        "cw_alarm_metric_month": 0.10,
        "cw_custom_metric_month": 0.30,
        # ElastiCache for Valkey on-demand nodes: the Redis OSS node prices less Valkey's 20% (public
        # pricing page, as recalled: not fetched here).
        **{f"elasticache:{node}": price for node, price in VALKEY_NODE_PRICES.items()},
    }
}
HOURS_30_DAYS = 720
MNG_DEFAULT_DISK_GIB = 20
GP3_INCLUDED_MIB_S = 125


@dataclass(frozen=True)
class Line:
    item: str
    quantity: float  # at the minimum (autoscaled node groups), else the fixed count
    unit_price: float  # per hour
    note: str = ""
    max_quantity: float | None = None  # autoscaled node groups: at their maximum

    @property
    def hourly(self) -> float:
        return self.quantity * self.unit_price

    @property
    def hourly_at_max(self) -> float:
        return (self.quantity if self.max_quantity is None else self.max_quantity) * self.unit_price


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--template", type=Path, default=Path("cdk.out/RayLlmPdServing.template.json"))
    parser.add_argument("--region", default="us-east-1", help="price table region (default us-east-1)")
    parser.add_argument("--on", type=datetime.date.fromisoformat, default=datetime.date.today(),
                        help="date for the EKS support status (default today)")  # fmt: skip
    parser.add_argument("--capacity-block-price", type=float, default=None, metavar="USD",
                        help="what a Capacity Block cost per instance-hour (its upfront fee / hours / "
                             "instances; preflight --block-hours lists offerings with theirs). "
                             "Default: left out of the total")  # fmt: skip


def estimate(
    template: dict[str, Any], region: str, on: datetime.date, capacity_block_price: float | None = None
) -> tuple[list[Line], str]:
    table_region = region if region in PRICES else "us-east-1"
    label = f"prices: {PRICES_SOURCE}" + ("" if table_region == region else f"; no table for {region}")
    prices = PRICES[table_region]
    resources = template["Resources"].values()
    lines = []
    for cluster in (r for r in resources if r["Type"] == "AWS::EKS::Cluster"):
        version = cluster["Properties"]["Version"]
        ends = EKS_STANDARD_SUPPORT_ENDS.get(version)
        extended = ends is not None and on > ends
        price = prices["eks_extended_hour" if extended else "eks_hour"]
        note = f"{version}, {'extended' if extended else 'standard'} support"
        lines.append(Line("EKS control plane", 1, price, note))
    nats = sum(r["Type"] == "AWS::EC2::NatGateway" for r in resources)
    lines.append(Line("NAT gateway", nats, prices["nat_hour"], f"plus ${prices['nat_gb']}/GB processed (not included)"))
    for group in (r["Properties"] for r in resources if r["Type"] == "AWS::EKS::Nodegroup"):
        (instance,) = group["InstanceTypes"]
        scaling = group["ScalingConfig"]
        low, high = scaling["MinSize"], scaling["MaxSize"]
        bounded = None if low == high else high
        price, note = _node_price(template, group, prices.get(instance), capacity_block_price)
        if bounded is not None:
            note = f"autoscaled {low} to {high}" + (f"; {note}" if note else "")
        lines.append(Line(f"{instance} nodes", low, price, note, bounded))
        disk, throughput = _disk(template, group)
        gp3 = prices["gp3_gb_month"] / HOURS_30_DAYS
        lines.append(
            Line(
                f"gp3 root volumes ({disk} GiB each)",
                low * disk,
                gp3,
                max_quantity=None if bounded is None else high * disk,
            )
        )
        if throughput > GP3_INCLUDED_MIB_S:  # provisioned throughput, per volume
            extra = throughput - GP3_INCLUDED_MIB_S
            lines.append(
                Line(
                    f"gp3 throughput ({throughput} MiB/s each, {extra} above the included {GP3_INCLUDED_MIB_S})",
                    low * extra,
                    prices["gp3_mibs_month"] / HOURS_30_DAYS,
                    max_quantity=None if bounded is None else high * extra,
                )
            )
    keys = sum(r["Type"] == "AWS::KMS::Key" for r in resources)
    lines.append(Line("KMS keys", keys, prices["kms_key_month"] / HOURS_30_DAYS))
    lines += _weights(list(resources), prices)
    lines += _api_keys(template, prices)
    lines += _gcs_store(list(resources), prices)
    lines += _observability(list(resources), prices)
    return lines, label


def _weights(resources: list[dict[str, Any]], prices: dict[str, float]) -> list[Line]:
    """The staged weights in the model bucket (S3 Standard), one copy per revision staged."""
    lines = []
    for staged in (r["Properties"] for r in resources if r["Type"] == "Custom::ModelWeights"):
        facts = MODELS.get(str(staged["Model"]))
        size = facts.checkpoint_gb if facts else None
        note = "one copy per revision staged" if size else "model outside the catalogue: size unknown"
        lines.append(Line("Model weights in S3", round(size or 0, 1), prices["s3_gb_month"] / HOURS_30_DAYS, note))
    return lines


def _api_keys(template: dict[str, Any], prices: dict[str, float]) -> list[Line]:
    """The key secret, and every Serve proxy (one per Ray pod) reading it every refresh."""
    services = [o for o in kubernetes_objects(template) if o.get("kind") == "RayService"]
    cluster = services[0]["spec"]["rayClusterConfig"] if services else {}
    head = cluster.get("headGroupSpec", {}).get("template", {}).get("spec", {}).get("containers", [{}])[0]
    env = {e["name"]: e.get("value") for e in head.get("env", [])}
    if proxy.REFRESH_ENV not in env:
        return []
    pods = 1 + sum(int(group.get("minReplicas", group["replicas"])) for group in cluster["workerGroupSpecs"])
    calls_per_hour = pods * 3600 / float(env[proxy.REFRESH_ENV])
    # The stack's own secret is a reference (``<logical id>``); a brought one is an ARN, not billed here.
    secrets = int(str(env.get(proxy.SECRET_ENV, "")).strip("<>") in template["Resources"])
    return [
        Line("Secrets Manager secret (API keys)", secrets, prices["secret_month"] / HOURS_30_DAYS),
        Line(
            "Secrets Manager reads (API keys)",
            round(calls_per_hour),
            prices["secret_calls_10k"] / 10_000,
            f"{pods} Serve proxies, one read each every {env[proxy.REFRESH_ENV]} s",
        ),
    ]


def _gcs_store(resources: list[dict[str, Any]], prices: dict[str, float]) -> list[Line]:
    """The Ray head's GCS store (gcs_fault_tolerance): its nodes, and its token's secret (read by
    the head's init container once per head start: no steady reads to price)."""
    lines = []
    for group in (r["Properties"] for r in resources if r["Type"] == "AWS::ElastiCache::ReplicationGroup"):
        node, nodes = group["CacheNodeType"], int(group["NumCacheClusters"])
        price = prices.get(f"elasticache:{node}")
        note = "the Ray GCS store" + ("" if price is not None else "; no price in table")
        lines.append(Line(f"ElastiCache {group['Engine']} {node} nodes", nodes, price or 0.0, note))
        lines.append(Line("Secrets Manager secret (GCS store token)", 1, prices["secret_month"] / HOURS_30_DAYS))
    return lines


def _observability(resources: list[dict[str, Any]], prices: dict[str, float]) -> list[Line]:
    """The dashboard, the alarms' metrics and the metrics the add-on's Ray scrape publishes."""
    if not any(r["Type"] == "AWS::EKS::Addon" and r["Properties"]["AddonName"] == ADDON_NAME for r in resources):
        return []
    month = 1 / HOURS_30_DAYS
    dashboards = sum(r["Type"] == "AWS::CloudWatch::Dashboard" for r in resources)
    alarm_metrics = sum(
        len([m for m in r["Properties"].get("Metrics", []) if "MetricStat" in m]) or 1
        for r in resources
        if r["Type"] == "AWS::CloudWatch::Alarm"
    )
    return [
        Line("CloudWatch dashboard", dashboards, prices["cw_dashboard_month"] * month, "the first 3 a month are free"),
        Line("CloudWatch alarm metrics", alarm_metrics, prices["cw_alarm_metric_month"] * month),
        Line(
            "CloudWatch custom metrics",
            custom_metric_count(sum(r["Type"] == "AWS::Logs::MetricFilter" for r in resources)),
            prices["cw_custom_metric_month"] * month,
            "Ray scrape; plus log ingestion, Container Insights and OTLP histograms, per GB (not included)",
        ),
    ]


def _node_price(
    template: dict[str, Any], group: dict[str, Any], on_demand: float | None, block_price: float | None
) -> tuple[float, str]:
    """A GPU node's hourly price and note by how it is bought (docs/features/capacity.md)."""
    missing = "no price in table"
    capacity = group.get("CapacityType")
    if capacity == "CAPACITY_BLOCK":
        if block_price is not None:
            return block_price, "Capacity Block, at the given price per instance-hour (prepaid)"
        return 0.0, (
            "Capacity Block: prepaid up front, not in this total; give --capacity-block-price (its upfront fee / "
            "hours / instances)"
        )
    if capacity == "SPOT":
        return on_demand or 0.0, (
            "spot: at most this on-demand price (no spot price is recorded here: they move with the market; "
            "aws ec2 describe-spot-price-history)"
            if on_demand is not None
            else missing
        )
    launch_template = group.get("LaunchTemplate")
    data = (
        template["Resources"][launch_template["Id"]["Ref"]]["Properties"]["LaunchTemplateData"]
        if launch_template
        else {}
    )
    if "CapacityReservationSpecification" in data:
        note = "On-Demand Capacity Reservation: billed at the on-demand rate while active, used or not"
        return on_demand or 0.0, note if on_demand is not None else f"{note}; {missing}"
    return on_demand or 0.0, "" if on_demand is not None else missing


def _disk(template: dict[str, Any], group: dict[str, Any]) -> tuple[int, int]:
    """A node's root volume: its size in GiB and its gp3 throughput in MiB/s."""
    launch_template = group.get("LaunchTemplate")
    if launch_template:
        data = template["Resources"][launch_template["Id"]["Ref"]]["Properties"]["LaunchTemplateData"]
        ebs = data["BlockDeviceMappings"][0]["Ebs"]
        return int(ebs["VolumeSize"]), int(ebs.get("Throughput", GP3_INCLUDED_MIB_S))
    return int(group.get("DiskSize", MNG_DEFAULT_DISK_GIB)), GP3_INCLUDED_MIB_S


def run(args: argparse.Namespace) -> int:
    if not args.template.exists():
        console.print(f"error: {args.template} not found. Fix: run make synth first")
        return 2
    lines, label = estimate(json.loads(args.template.read_text()), args.region, args.on, args.capacity_block_price)
    hourly = sum(ln.hourly for ln in lines)
    if all(ln.max_quantity is None for ln in lines):
        rows = [
            [ln.item, f"{ln.quantity:g}", f"${ln.hourly:,.4f}", f"${ln.hourly * HOURS_30_DAYS:,.2f}", ln.note]
            for ln in lines
        ]
        rows.append(["total (estimate)", "", f"${hourly:,.2f}", f"${hourly * HOURS_30_DAYS:,.2f}", ""])
        console.print(table("Cost estimate", ["item", "qty", "per hour", "30 days", "note"], rows))
    else:
        rows = [
            [
                ln.item,
                f"{ln.quantity:g}" if ln.max_quantity is None else f"{ln.quantity:g} to {ln.max_quantity:g}",
                f"${ln.hourly * HOURS_30_DAYS:,.2f}",
                f"${ln.hourly_at_max * HOURS_30_DAYS:,.2f}",
                ln.note,
            ]
            for ln in lines
        ]
        at_max = sum(ln.hourly_at_max for ln in lines)
        rows.append(["total (estimate)", "", f"${hourly * HOURS_30_DAYS:,.2f}", f"${at_max * HOURS_30_DAYS:,.2f}", ""])
        columns = ["item", "qty", "30 days at min", "30 days at max", "note"]
        console.print(table("Cost estimate (autoscaling: every group at its min, at its max)", columns, rows))
    console.print(label)
    return 0
