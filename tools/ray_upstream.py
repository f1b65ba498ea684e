"""Digests of the Ray definitions the PD failover overrides or calls into (its ``UPSTREAM``), read
from an installed Ray's source files without importing them (Ray Serve LLM's modules need vLLM).

    python tools/ray_upstream.py <python with ray>   # prints the version's digests as the module holds them

``tests/gates/test_ray_upstream.py`` holds the failover's record to what each pinned Ray has."""

from __future__ import annotations

import ast
import hashlib
import json
import subprocess
import sys
from pathlib import Path

RECORD = Path(__file__).resolve().parents[1] / "constructs/eks_pd_serving/fault_tolerance/failover/upstream.py"


def recorded() -> tuple[tuple[str, ...], dict[str, tuple[str, ...]]]:
    """The failover's record (``upstream.py``): ``UPSTREAM_DEFINITIONS`` and ``UPSTREAM``, read from its source."""
    tree = ast.parse(RECORD.read_text())
    values = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id in ("UPSTREAM_DEFINITIONS", "UPSTREAM"):
            values[target.id] = ast.literal_eval(value)
    return tuple(values["UPSTREAM_DEFINITIONS"]), {v: tuple(d.split()) for v, d in values["UPSTREAM"].items()}


def ray_of(python: str) -> tuple[str, Path]:
    """(Ray's version, its site-packages folder) as ``python`` has it."""
    code = "import os, ray; print(ray.__version__); print(os.path.dirname(os.path.dirname(ray.__file__)))"
    version, root = subprocess.run(
        [python, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout.split()[-2:]
    return version, Path(root)


def definition_digest(root: Path, definition: str) -> str:
    """sha256 (16 hex) of one ``file:Class.method`` definition's source text, or ``missing``."""
    file, _, qualname = definition.partition(":")
    text = (root / file).read_text()
    nodes: list[ast.AST] = list(ast.parse(text).body)
    node: ast.AST | None = None
    for part in qualname.split("."):
        node = next((n for n in nodes if getattr(n, "name", None) == part), None)
        if node is None:
            return "missing"
        nodes = list(getattr(node, "body", []))
    segment = ast.get_source_segment(text, node) or ""  # type: ignore[arg-type]
    return hashlib.sha256(segment.encode()).hexdigest()[:16]


def digests(python: str) -> tuple[str, tuple[str, ...]]:
    """The installed Ray's version and its digests, in the order of ``UPSTREAM_DEFINITIONS``."""
    definitions, _ = recorded()
    version, root = ray_of(python)
    return version, tuple(definition_digest(root, d) for d in definitions)


def changed(python: str) -> tuple[str, list[str]]:
    """The installed Ray's version and the definitions whose source differs from the record (all of
    them when its version has none)."""
    definitions, record = recorded()
    version, found = digests(python)
    was = record.get(version, ("",) * len(definitions))
    return version, [d for d, now, then in zip(definitions, found, was, strict=True) if now != then]


if __name__ == "__main__":
    version, found = digests(sys.argv[1])
    print(json.dumps({version: " ".join(found)}))
