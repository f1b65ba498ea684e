"""Rules on who reaches the Ray pods: with an NLB, the serve port admits exactly its subnets."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import facts
from ..graph import StackModel, named
from .finding import Finding

SERVE_PORT = 8000


def serve_port_admits_nlb_subnets(model: StackModel) -> list[Finding]:
    """With an NLB in front (client IP preservation off), the serve port's NetworkPolicy admits
    exactly the NLB subnets' CIDRs: those are the sources its health checks and requests come from."""
    subnets: list[str] = []
    for resource in model.of_type(facts.MANIFEST):
        for obj in facts.kube_objects(resource):
            annotations = obj.body.get("metadata", {}).get("annotations") or {}
            listed = annotations.get("service.beta.kubernetes.io/aws-load-balancer-subnets")
            if obj.kind == "Service" and listed:
                subnets += [s.strip() for s in str(listed).split(",")]
    if not subnets:
        return []
    cidrs = {}
    for subnet in subnets:
        target = named(subnet)
        cidr = facts.subnet_cidr(model, target) if target else None
        if cidr is None:
            return []  # a brought VPC's subnets: their CIDRs are not in the template
        cidrs[subnet] = cidr
    found = []
    for resource in model.of_type(facts.MANIFEST):
        for obj in facts.kube_objects(resource):
            if obj.kind != "NetworkPolicy":
                continue
            admitted = set(_ip_blocks_on_port(obj.body, SERVE_PORT))
            if not admitted:
                continue
            rule = "serve_port_admits_nlb_subnets"
            found += [
                Finding(rule, resource.id, f"{obj.key} does not admit NLB subnet {s} ({c})")
                for s, c in cidrs.items()
                if c not in admitted
            ]
            found += [
                Finding(rule, resource.id, f"{obj.key} admits {c} beyond the NLB subnets")
                for c in sorted(admitted - set(cidrs.values()))
            ]
    return found


def _ip_blocks_on_port(policy: Mapping[str, Any], port: int) -> list[str]:
    blocks = []
    for rule in (policy.get("spec") or {}).get("ingress") or []:
        ports = [p.get("port") for p in rule.get("ports") or []]
        if port in ports:
            blocks += [peer["ipBlock"]["cidr"] for peer in rule.get("from") or [] if "ipBlock" in peer]
    return blocks
