"""Field-level diff of the Kubernetes side of two synthesized assemblies.

Every Kubernetes object and Helm release in two cdk.out folders (or template files), compared
field by field; the RayService's serveConfigV2 is parsed as YAML, so a change reads
`...decode_config.engine_kwargs.max_model_len: 4096 -> 8192` instead of two long strings.
Exit 0 when nothing on the Kubernetes side changed, 1 when something did.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from ..assembly import MISSING, field_diff, helm_releases, kubernetes_objects, templates
from ._common import console


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("old", type=Path, help="cdk.out folder (or template) before")
    parser.add_argument("new", type=Path, help="cdk.out folder (or template) after")


def _expanded(obj: dict[str, Any]) -> dict[str, Any]:
    """The object with embedded YAML (serveConfigV2) parsed and list items keyed by name."""
    spec = obj.get("spec", {})
    if isinstance(spec.get("serveConfigV2"), str):
        obj = {**obj, "spec": {**spec, "serveConfigV2": yaml.safe_load(spec["serveConfigV2"])}}
    return obj


def side(assembly: Path) -> dict[str, Any]:
    """'<stack>/<kind>/<namespace>/<name>' or '<stack>/helm/<release>' -> content."""
    found: dict[str, Any] = {}
    for stack, template in templates(assembly).items():
        for obj in kubernetes_objects(template):
            meta = obj.get("metadata", {})
            found[f"{stack}/{obj['kind']}/{meta.get('namespace', '-')}/{meta.get('name')}"] = _expanded(obj)
        for release, content in helm_releases(template).items():
            found[f"{stack}/helm/{release}"] = content
    return found


def _show(value: Any) -> str:
    return (
        "(absent)"
        if value is MISSING
        else yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()
    )


def run(args: argparse.Namespace) -> int:
    for path in (args.old, args.new):
        if not path.exists():
            console.print(f"error: {path} not found. Fix: synthesize it first (make synth, or cdk synth -o <dir>)")
            return 2
    changes = field_diff(side(args.old), side(args.new))
    for path, old, new in changes:
        console.print(f"{path}: {_show(old)} -> {_show(new)}", markup=False)
    console.print(f"{len(changes)} change(s) on the Kubernetes side" if changes else "no change on the Kubernetes side")
    return 1 if changes else 0
