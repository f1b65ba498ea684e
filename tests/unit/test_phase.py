"""A phase is ``Phase``, never a bare string: no module of the package writes "prefill" or "decode"
as a literal except the enum itself and the pod programs, which run in a Ray pod without the
package and read the phases from the JSON they are given."""

from __future__ import annotations

import io
import tokenize
from pathlib import Path

import pytest

from eks_pd_serving.config import DeploymentConfig
from eks_pd_serving.config.phases import phase_settings
from eks_pd_serving.phase import PHASES, Phase

PACKAGE = Path(__file__).resolve().parents[2] / "constructs" / "eks_pd_serving"
# The enum, and the programs shipped into pods as files (``_private/pod_code.Shipped``).
OWN_STRINGS = {"phase.py", "fault_tolerance/failover/eks_pd_failover.py", "rollout/eks_pd_rollout.py"}


def phase_literals(source: str) -> list[int]:
    """Lines holding the string literal "prefill" or "decode" (quotes of either kind)."""
    return [
        token.start[0]
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.STRING and token.string.strip("'\"") in PHASES and len(token.string) < 10
    ]


def test_no_module_writes_a_phase_as_a_string() -> None:
    found = [
        f"{path.relative_to(PACKAGE)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if str(path.relative_to(PACKAGE)) not in OWN_STRINGS
        for line in phase_literals(path.read_text())
    ]
    assert found == []


def test_the_check_finds_a_bare_phase() -> None:
    assert phase_literals('engine = served.prefill if phase == "prefill" else served.decode\n') == [1]
    assert phase_literals("x = {'decode': 1}\n") == [1]
    assert phase_literals('"""the prefill phase"""\n') == []


def test_a_phase_read_back_from_text_is_refused_unless_it_is_one() -> None:
    config = DeploymentConfig.create()
    assert phase_settings(config, Phase("decode")).replicas == config.decode_replicas
    with pytest.raises(ValueError, match="'both' is not a valid Phase"):
        Phase("both")
    assert [p.kv_role for p in PHASES] == ["kv_producer", "kv_consumer"]
    assert [f"{p}-workers" for p in PHASES] == ["prefill-workers", "decode-workers"]  # written as its value
