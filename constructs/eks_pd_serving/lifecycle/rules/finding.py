"""What a rule returns: the rule, the resource and the missing edge (or fact)."""

from __future__ import annotations

from dataclasses import dataclass

from ..graph import StackModel


@dataclass(frozen=True, order=True)
class Finding:
    rule: str
    resource: str
    missing: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.resource}: {self.missing}"


def needs_edge(model: StackModel, rule: str, resource: str, target: str, why: str) -> list[Finding]:
    if model.deleted_before(resource, target):
        return []
    return [Finding(rule, resource, f"no dependency on {target} ({why})")]
