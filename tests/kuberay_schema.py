"""Validate objects against a KubeRay CRD's openAPIV3Schema, as strictly as `kubectl --validate=strict`.

The API server silently prunes fields a CRD does not declare; here an undeclared field is an
error, so a typo such as ``rayStartParam`` fails the test instead of vanishing on deploy.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import yaml


def load_crd_schema(crd_file: Path, version: str = "v1") -> dict[str, Any]:
    crd = yaml.safe_load(crd_file.read_text())
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return strict(served["schema"]["openAPIV3Schema"])


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """Forbid undeclared properties wherever the schema declares properties and keeps no unknowns."""
    schema = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


def schema_errors(schema: dict[str, Any], obj: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(schema)
    return [
        f"{'/'.join(str(p) for p in error.absolute_path) or '<root>'}: {error.message}"
        for error in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
    ]
