"""Names the network charts give and ``verify`` looks for in the cluster. Node-free, so the CLI
reads them without starting jsii."""

from __future__ import annotations

# The lock-down's policies in every exposure (verify checks each is in the cluster).
DEFAULT_DENY_POLICY = "default-deny-ingress"
RAY_CLUSTER_POLICY = "ray-cluster-internal"
OPERATOR_POLICY = "ray-from-operator"
SERVE_POLICY = "ray-serve-from-clients"
LOCK_DOWN_POLICIES = (DEFAULT_DENY_POLICY, RAY_CLUSTER_POLICY, OPERATOR_POLICY, SERVE_POLICY)
# The Ray pods' own connections, limited (the stack always applies it: ``PdServing``'s limit_egress).
RAY_EGRESS_POLICY = "ray-egress"


def endpoint_service_name(ray_service_name: str) -> str:
    """The endpoint Service's name (verify reads the NLB's address from it)."""
    return f"{ray_service_name}-endpoint"
