"""The fault rehearsal as a harness (rehearsal/faults/): every fault is a unit of the registry, the
verdict asks each judged fault's unit by its key, the parent hands the child one set of run
arguments, and the docs' fault table is the registry's."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import Any

import pytest

import rehearsal.faults
from rehearsal.faults import registry
from rehearsal.faults.fault import Fault, RunArgs
from rehearsal.faults.judge import holds
from tools import fault_reference


def defined_faults() -> dict[str, Fault]:
    """Every ``Fault`` instance a module of the package defines, by its key."""
    found: dict[str, Fault] = {}
    for module in pkgutil.iter_modules(rehearsal.faults.__path__):
        if module.name == "__main__":
            continue
        loaded = importlib.import_module(f"rehearsal.faults.{module.name}")
        found |= {v.key: v for v in vars(loaded).values() if isinstance(v, Fault)}
    return found


def test_every_fault_defined_in_the_package_is_registered_once_under_its_own_key() -> None:
    assert sorted(defined_faults()) == sorted(registry.KEYS)
    assert len(set(registry.KEYS)) == len(registry.FAULTS)
    assert registry.KEYS[-1] == "gcs"  # a dead GCS without a store takes every Ray process with it
    for fault in registry.FAULTS:
        assert fault.injects and fault.heals and fault.shows, fault.key
        for start, key in fault.titles:  # an older recording's title is read back to its key and fault
            assert registry.fault_key(f"{start} at 12:00") == key
            assert registry.unit_of(registry.fault_key(f"{start} at 12:00")) is fault


class Probe(Fault):
    """A fault added as a new unit would be: its own checks reach the verdict by its key."""

    key = "probe"
    injects = heals = shows = "nothing"
    titles = (("probe", "probe"),)

    def __init__(self, verdict: bool) -> None:
        self.verdict = verdict

    def holds(self, judged: dict[str, Any], report: dict[str, Any]) -> bool:
        return self.verdict and judged["key"] == "probe"


def test_the_registry_check_sees_a_fault_defined_but_left_out_of_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    from rehearsal.faults import kv

    monkeypatch.setattr(kv, "ANOTHER", Probe(True), raising=False)  # a new unit, its line forgotten
    assert "probe" in defined_faults() and "probe" not in registry.KEYS


@pytest.mark.parametrize("verdict", [True, False])
def test_the_verdict_asks_each_judged_faults_unit_by_its_key(monkeypatch: pytest.MonkeyPatch, verdict: bool) -> None:
    monkeypatch.setattr(registry, "_BY_KEY", {**registry._BY_KEY, "probe": Probe(verdict)})
    judged = {"fault": "anything", "key": "probe", "recovered_s": 3.0, "wrong_answers": 0}
    report = {"faults_chosen": ["probe"], "faults": [judged], "failover": None}
    assert holds(report) is verdict
    assert not holds({**report, "faults": []})  # chosen, never injected


def test_the_parent_hands_the_child_its_run_arguments_whole() -> None:
    run = RunArgs(Path("t.json"), Path("ck"), Path("r/faults.json"), ("kv", "gcs"), ("both",), 10.0, 20.0, True,
                  3, True, 5.0, "EKSPD-KV-1")  # fmt: skip
    assert RunArgs.from_json(run.to_json()) == run
    assert run.events == Path("r/faults.events.jsonl")


def test_the_docs_fault_table_is_the_registrys() -> None:
    assert fault_reference.main(["--check"]) == 0
    page = fault_reference.PAGE.read_text()
    for fault in registry.FAULTS:
        assert f"| `{fault.key}` | {fault.injects} |" in page
