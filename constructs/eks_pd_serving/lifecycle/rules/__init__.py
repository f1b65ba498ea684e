"""Lifecycle rules: small named functions over ``StackModel``, each returning what is wrong as
findings (``finding``) that name the rule, the resource and the missing edge (or fact). By subject:
``capacity``, ``destroy``, ``network``, ``placement``, ``reservations``; update rules (``updates``)
take the templates before and after a setting flips, and ``named_log_groups_preflighted`` the names
preflight checks."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ..graph import StackModel
from .capacity import (
    NodeBudget,
    head_cpu_m,
    new_cluster_upgrade_fits,
    ray_heads,
    system_budget,
    system_nodes_hold_their_pods,
)
from .destroy import (
    aws_controllers_outlive_credentials_and_nodes,
    aws_controllers_outlive_dns,
    finalized_objects_outlive_no_controller,
    kubectl_resources_outlive_api_route,
    kubectl_resources_outlive_egress,
    lambda_log_groups_outlive_their_functions,
    ray_clusters_outlive_no_gcs_store,
)
from .finding import Finding
from .network import serve_port_admits_nlb_subnets
from .placement import no_unmovable_pods_on_autoscaled_nodes, rendered_agents, workloads_follow_their_nodes
from .reservations import (
    block_end_failures_are_kept_and_alarmed,
    capacity_blocks_scale_to_zero_before_their_end,
    checks_never_refuse_a_rollback,
    reserved_groups_roll_without_a_surge,
)
from .updates import (
    engines_start_after_their_weights,
    moved_objects_applied_before_prune,
    named_log_groups_preflighted,
    old_pods_keep_what_they_mount,
    pruned_objects_leave,
    waited_jobs_are_pruned,
    waited_jobs_fit_their_names,
    waited_jobs_leave_after_they_finish,
    waited_jobs_move_with_what_they_apply,
)

# The rules over the templates before and after a change.
UPDATE_RULES: dict[str, Callable[[StackModel, StackModel], list[Finding]]] = {
    rule.__name__: rule
    for rule in (
        pruned_objects_leave,
        old_pods_keep_what_they_mount,
        moved_objects_applied_before_prune,
        waited_jobs_move_with_what_they_apply,
    )
}

TEMPLATE_RULES: dict[str, Callable[[StackModel], list[Finding]]] = {
    rule.__name__: rule
    for rule in (
        kubectl_resources_outlive_api_route,
        kubectl_resources_outlive_egress,
        lambda_log_groups_outlive_their_functions,
        aws_controllers_outlive_dns,
        aws_controllers_outlive_credentials_and_nodes,
        finalized_objects_outlive_no_controller,
        ray_clusters_outlive_no_gcs_store,
        no_unmovable_pods_on_autoscaled_nodes,
        workloads_follow_their_nodes,
        system_nodes_hold_their_pods,
        new_cluster_upgrade_fits,
        serve_port_admits_nlb_subnets,
        capacity_blocks_scale_to_zero_before_their_end,
        reserved_groups_roll_without_a_surge,
        block_end_failures_are_kept_and_alarmed,
        checks_never_refuse_a_rollback,
        waited_jobs_are_pruned,
        waited_jobs_leave_after_they_finish,
        waited_jobs_fit_their_names,
        engines_start_after_their_weights,
    )
}


def check(model: StackModel, preflighted: Iterable[str] | None = None) -> list[Finding]:
    """Every template rule's findings, sorted (and the preflight rule when its names are given)."""
    found = [finding for rule in TEMPLATE_RULES.values() for finding in rule(model)]
    if preflighted is not None:
        found += named_log_groups_preflighted(model, preflighted)
    return sorted(found)


__all__ = [
    "TEMPLATE_RULES",
    "UPDATE_RULES",
    "Finding",
    "NodeBudget",
    "aws_controllers_outlive_credentials_and_nodes",
    "aws_controllers_outlive_dns",
    "block_end_failures_are_kept_and_alarmed",
    "capacity_blocks_scale_to_zero_before_their_end",
    "check",
    "checks_never_refuse_a_rollback",
    "engines_start_after_their_weights",
    "finalized_objects_outlive_no_controller",
    "head_cpu_m",
    "kubectl_resources_outlive_api_route",
    "kubectl_resources_outlive_egress",
    "lambda_log_groups_outlive_their_functions",
    "moved_objects_applied_before_prune",
    "named_log_groups_preflighted",
    "new_cluster_upgrade_fits",
    "no_unmovable_pods_on_autoscaled_nodes",
    "old_pods_keep_what_they_mount",
    "pruned_objects_leave",
    "ray_clusters_outlive_no_gcs_store",
    "ray_heads",
    "rendered_agents",
    "reserved_groups_roll_without_a_surge",
    "serve_port_admits_nlb_subnets",
    "system_budget",
    "system_nodes_hold_their_pods",
    "waited_jobs_are_pruned",
    "waited_jobs_fit_their_names",
    "waited_jobs_leave_after_they_finish",
    "waited_jobs_move_with_what_they_apply",
    "workloads_follow_their_nodes",
]
