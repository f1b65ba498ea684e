"""The rollouts are planned once, before any manifest (``rollout_plan``): ``PdServing`` plans them
from the settings and ``RayServiceManifest`` applies the plan it is given; alone, it plans the
default (no rebuild by the deploy)."""

from __future__ import annotations

from dataclasses import replace

from aws_cdk import Stack
from support import build_stack

from eks_pd_serving import rollout
from eks_pd_serving.rollout_plan import SERVE_STEP_S, rollout_plan


def test_pd_serving_plans_the_settings_rollouts_and_the_manifest_applies_them() -> None:
    stack = build_stack()  # ray_upgrade_strategy=recreate: the deploy rebuilds the cluster
    manifest = stack.serving.ray_service
    plan = manifest.plan
    assert manifest.rollout is plan.rollout is not None and manifest.serve_rollout is plan.serve_rollout is not None
    assert plan.rollout.deadline_s == stack.serving.plan.rollout_deadline_s == 720
    assert plan.serve_rollout.step_s == stack.serving.plan.serve_step_s
    assert plan.annotations == {rollout.digest_annotation(): plan.cluster_digest}
    # The same props planned again give the same plan: nothing in it depends on when it is made.
    again = rollout_plan(manifest.props, Stack.of(manifest).resolve, converge=True, rollout_deadline_s=720,
                         serve_step_s=plan.serve_rollout.step_s)  # fmt: skip
    assert again == plan


def test_the_plan_follows_the_strategy() -> None:
    manifest = build_stack(ray_upgrade_strategy="manual").serving.ray_service
    assert manifest.plan.rollout is None and manifest.plan.annotations is None  # nothing rebuilds it
    assert manifest.plan.serve_rollout is not None
    assert rollout.digest_annotation() not in manifest.plan.serve_rollout.code  # rolls onto the running cluster
    # Without the failover's layout there is no serve rollout: Ray's one application restarts whole.
    assert build_stack(pd_failover=False).serving.ray_service.plan.serve_rollout is None


def test_a_plan_made_with_other_settings_changes_what_is_applied() -> None:
    stack = build_stack(ray_upgrade_strategy="manual")
    manifest = stack.serving.ray_service
    longer = rollout_plan(manifest.props, Stack.of(manifest).resolve, serve_step_s=2 * SERVE_STEP_S)
    assert longer.serve_rollout is not None and manifest.plan.serve_rollout is not None
    assert longer.serve_rollout.step_s != manifest.plan.serve_rollout.step_s
    assert replace(longer.serve_rollout, step_s=manifest.plan.serve_rollout.step_s,
                   deadline_s=manifest.plan.serve_rollout.deadline_s, template_digest="") == replace(
        manifest.plan.serve_rollout, template_digest="")  # fmt: skip
    assert longer.serve_rollout.job_name != manifest.plan.serve_rollout.job_name  # its name carries its spec
