"""A synthesized template as CloudFormation orders it: who depends on whom, and the create and
delete waves that follow. Plain JSON, no aws-cdk-lib.

CloudFormation creates a resource once everything it depends on exists, and deletes it once
everything that depends on it is gone. So "A is deleted before B" holds exactly when A depends on
B, directly or through others; the rules in ``rules.py`` ask that question.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

_SUB_NAME = re.compile(r"\$\{([A-Za-z0-9:]+)(?:\.([A-Za-z0-9.]+))?\}")


@dataclass(frozen=True)
class Resource:
    id: str
    type: str
    properties: Mapping[str, Any]
    depends_on: tuple[str, ...]
    deletion_policy: str | None


def reference_paths(value: Any, path: str = "") -> Iterator[tuple[str, str, str | None]]:
    """(property path, logical id or pseudo parameter, attribute or None) for every reference a
    property value makes: Ref, Fn::GetAtt, and the names inside Fn::Sub. Paths stop at an intrinsic
    function's own key (a reference inside an Fn::Join is one of the property holding it)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "Ref" and isinstance(item, str):
                yield path, item, None
            elif key == "Fn::GetAtt":
                parts = item if isinstance(item, list) else str(item).split(".", 1)
                yield path, str(parts[0]), str(parts[1]) if len(parts) > 1 else None
            elif key == "Fn::Sub":
                text, variables = (item, {}) if isinstance(item, str) else (item[0], item[1])
                for match in _SUB_NAME.finditer(text):
                    if match.group(1) not in variables:
                        yield path, match.group(1), match.group(2)
                yield from reference_paths(variables, path)
            else:
                yield from reference_paths(item, path if key.startswith("Fn::") else f"{path}/{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from reference_paths(item, f"{path}/{index}")


def references(value: Any) -> Iterator[str]:
    """Every logical id (or pseudo parameter) a property value names."""
    return (target for _, target, _ in reference_paths(value))


def placeholders(value: Any) -> Any:
    """The value with Fn::Join flattened and each Ref / GetAtt written as ``${Id}`` /
    ``${Id.Attr}``, so an embedded manifest or values document parses as JSON."""
    if isinstance(value, dict):
        if "Fn::Join" in value:
            separator, parts = value["Fn::Join"]
            return str(separator).join(str(placeholders(part)) for part in parts)
        if set(value) == {"Ref"}:
            return "${" + str(value["Ref"]) + "}"
        if set(value) == {"Fn::GetAtt"}:
            target = value["Fn::GetAtt"]
            return "${" + (".".join(target) if isinstance(target, list) else str(target)) + "}"
        return {k: placeholders(v) for k, v in value.items()}
    if isinstance(value, list):
        return [placeholders(v) for v in value]
    return value


def named(text: str) -> str | None:
    """The logical id in a ``${Id}`` / ``${Id.Attr}`` placeholder, or None for a literal."""
    match = re.fullmatch(r"\$\{([A-Za-z0-9]+)(?:\.[A-Za-z0-9.]+)?\}", text)
    return match.group(1) if match else None


class StackModel:
    """The resources of one template and their dependency graph."""

    def __init__(self, template: Mapping[str, Any]) -> None:
        self.template = template
        self.resources: dict[str, Resource] = {
            logical_id: Resource(
                id=logical_id,
                type=body["Type"],
                properties=body.get("Properties", {}),
                depends_on=tuple(
                    [body["DependsOn"]] if isinstance(body.get("DependsOn"), str) else body.get("DependsOn", [])
                ),
                deletion_policy=body.get("DeletionPolicy"),
            )
            for logical_id, body in template["Resources"].items()
        }
        self.edges: dict[str, frozenset[str]] = {
            r.id: frozenset(
                name for name in (*references(r.properties), *r.depends_on) if name in self.resources and name != r.id
            )
            for r in self.resources.values()
        }

    @classmethod
    def from_json(cls, text: str) -> StackModel:
        return cls(json.loads(text))

    def of_type(self, type_: str) -> list[Resource]:
        return [r for r in self.resources.values() if r.type == type_]

    @cached_property
    def _closure(self) -> dict[str, frozenset[str]]:
        closure: dict[str, frozenset[str]] = {}

        def visit(node: str, path: tuple[str, ...]) -> frozenset[str]:
            if node in closure:
                return closure[node]
            if node in path:
                raise ValueError(f"dependency cycle: {' -> '.join((*path, node))}")
            found: set[str] = set()
            for dependency in self.edges[node]:
                found |= {dependency, *visit(dependency, (*path, node))}
            closure[node] = frozenset(found)
            return closure[node]

        for node in sorted(self.edges):
            visit(node, ())
        return closure

    def needs(self, resource: str) -> frozenset[str]:
        """Everything ``resource`` depends on, directly or not: created before it, deleted after it."""
        return self._closure[resource]

    def deleted_before(self, first: str, then: str) -> bool:
        """Whether CloudFormation is bound to delete ``first`` before ``then``."""
        return then in self._closure[first]

    def create_waves(self) -> list[list[str]]:
        """Resources by the earliest round CloudFormation can create them in."""
        depth: dict[str, int] = {}
        for node in sorted(self.edges, key=lambda n: len(self._closure[n])):
            depth[node] = 1 + max((depth[d] for d in self.edges[node]), default=-1)
        return _layers(depth)

    def delete_waves(self) -> list[list[str]]:
        """Resources by the earliest round CloudFormation can delete them in: nothing depends on
        the first wave's resources."""
        dependents: dict[str, set[str]] = {node: set() for node in self.edges}
        for node, dependencies in self.edges.items():
            for dependency in dependencies:
                dependents[dependency].add(node)
        depth: dict[str, int] = {}
        for node in sorted(self.edges, key=lambda n: sum(n in c for c in self._closure.values())):
            depth[node] = 1 + max((depth[d] for d in dependents[node]), default=-1)
        return _layers(depth)


def _layers(depth: Mapping[str, int]) -> list[list[str]]:
    waves: list[list[str]] = [[] for _ in range(1 + max(depth.values(), default=-1))]
    for node in sorted(depth):
        waves[depth[node]].append(node)
    return waves
