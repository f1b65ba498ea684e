"""The Ray code the PD failover overrides or calls into (``UPSTREAM_DEFINITIONS``) is the code it
was written against: each definition's source digest in the image's Ray (2.58.0, ``.venv-ray``)
matches the record beside the copy (``UPSTREAM``); the rehearsal's Ray 2.60 is held the same way in
tests/rehearsal/test_failover.py."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import ray_upstream

from eks_pd_serving.versions import RAY_VERSION

RAY_PYTHON = os.environ.get("EKS_PD_RAY_PYTHON")
needs_ray = pytest.mark.skipif(not RAY_PYTHON, reason="needs the Ray virtualenv (make test)")


@needs_ray
def test_the_images_ray_has_the_code_the_failover_overrides_unchanged() -> None:
    version, changed = ray_upstream.changed(str(RAY_PYTHON))
    assert version == RAY_VERSION
    assert changed == [], f"Ray {version} changed what the failover overrides: read them again, then re-record"


@needs_ray
def test_the_check_fails_when_one_overridden_method_changes(tmp_path: Path) -> None:
    """A changed line in a copy of Ray's decode orchestrator: its digest no longer matches."""
    _, root = ray_upstream.ray_of(str(RAY_PYTHON))
    definitions, record = ray_upstream.recorded()
    definition = definitions[0]
    file = definition.partition(":")[0]
    copy = tmp_path / file
    copy.parent.mkdir(parents=True)
    shutil.copy(root / file, copy)
    assert ray_upstream.definition_digest(tmp_path, definition) == record[RAY_VERSION][0]
    text = copy.read_text()
    copy.write_text(text.replace("prefill_handle = self._prefill_handle", "prefill_handle = self._prefill_handle  # x"))
    assert ray_upstream.definition_digest(tmp_path, definition) != record[RAY_VERSION][0]


def test_every_pinned_ray_version_has_a_digest_for_every_definition() -> None:
    definitions, record = ray_upstream.recorded()
    assert RAY_VERSION in record
    assert {len(digests) for digests in record.values()} == {len(definitions)}


def test_the_record_covers_the_images_ray_and_vllm_and_the_engines_are_told() -> None:
    """Each engine replica refuses to start on a pair the record does not cover (``check_versions``):
    the image's pair must be covered, and both phases' args carry the pairs."""
    import yaml
    from support import ray_service

    from eks_pd_serving.fault_tolerance.failover import upstream
    from eks_pd_serving.versions import VLLM_VERSION

    assert (RAY_VERSION, VLLM_VERSION) in upstream.COVERED
    assert set(upstream.UPSTREAM) == {ray for ray, _ in upstream.COVERED}
    config = yaml.safe_load(ray_service()["spec"]["serveConfigV2"])
    phases = [app for app in config["applications"] if "llm_config" in app["args"]]
    assert phases and all(app["args"]["covered"] == [list(p) for p in upstream.COVERED] for app in phases)
