"""Read the Kubernetes side of a synthesized cloud assembly (cdk.out): every manifest object
and Helm release, with the region token flattened. Plain JSON: no aws-cdk-lib import, so the
CPU rehearsal's virtualenv can use it too."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

MANIFEST_TYPE = "Custom::AWSCDK-EKS-KubernetesResource"
HELM_TYPE = "Custom::AWSCDK-EKS-HelmChart"
REGION_PLACEHOLDER = "${AWS::Region}"
# A field on one side only.
MISSING = object()


def resolve(value: Any, region: str = REGION_PLACEHOLDER) -> Any:
    """Flatten what the manifests hold: Fn::Join, Ref AWS::Region (``region``), and the Ref of a
    resource of the stack (the model bucket's name), shown as ``<LogicalId>``."""
    if isinstance(value, dict):
        if "Fn::Join" in value:
            separator, parts = value["Fn::Join"]
            return str(separator).join(str(resolve(part, region)) for part in parts)
        if value == {"Ref": "AWS::Region"}:
            return region
        if set(value) == {"Ref"} and isinstance(value["Ref"], str):
            return f"<{value['Ref']}>"
        return {k: resolve(v, region) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, region) for v in value]
    return value


def templates(assembly: Path) -> dict[str, dict[str, Any]]:
    """Stack name -> template, for every stack in a cdk.out folder (or one template file)."""
    if assembly.is_file():
        return {assembly.name.removesuffix(".template.json"): json.loads(assembly.read_text())}
    return {
        p.name.removesuffix(".template.json"): json.loads(p.read_text())
        for p in sorted(assembly.glob("*.template.json"))
    }


def kubernetes_objects(template: Mapping[str, Any], region: str = REGION_PLACEHOLDER) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = []
    for resource in template["Resources"].values():
        if resource["Type"] == MANIFEST_TYPE:
            objects += json.loads(resolve(resource["Properties"]["Manifest"], region))
    return objects


def helm_releases(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    releases = {}
    for resource in template["Resources"].values():
        if resource["Type"] == HELM_TYPE:
            props = resolve(resource["Properties"])
            values = json.loads(props["Values"]) if props.get("Values") else {}
            releases[props["Release"]] = {
                "chart": props.get("Chart"),
                "version": props.get("Version"),
                "repository": props.get("Repository"),
                "namespace": props.get("Namespace"),
                "values": values,
            }
    return releases


def _key(item: Any, index: int) -> str:
    if isinstance(item, dict):
        for field in ("name", "groupName"):
            if isinstance(item.get(field), str):
                return str(item[field])
    return str(index)


def field_diff(old: Any, new: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """(path, old, new) for every leaf that differs; lists of named items match by name."""
    if isinstance(old, dict) and isinstance(new, dict):
        changes = []
        for key in list(old) + [k for k in new if k not in old]:
            changes += field_diff(old.get(key, MISSING), new.get(key, MISSING), f"{path}.{key}" if path else str(key))
        return changes
    if isinstance(old, list) and isinstance(new, list):
        olds = {_key(v, i): v for i, v in enumerate(old)}
        news = {_key(v, i): v for i, v in enumerate(new)}
        changes = []
        for key in list(olds) + [k for k in news if k not in olds]:
            changes += field_diff(olds.get(key, MISSING), news.get(key, MISSING), f"{path}[{key}]")
        return changes
    return [] if old == new else [(path, old, new)]
