"""The pods' programs (the key check, the GCS token reader, the KV guard) as the package ships them:
a file beside its package's ``__init__``, read exactly as the pods run it, and the short digest a pod
annotation carries, so new code changes the pod template on purpose. No CDK: the rehearsals import it."""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path
from typing import Any


def source(package_file: str, file_name: str) -> str:
    """The text of ``file_name`` beside ``package_file`` (a package's ``__file__``)."""
    return (Path(package_file).parent / file_name).read_text()


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def constant(text: str, file_name: str, name: str) -> Any:
    """The literal a module-level ``name = ...`` assigns in ``text`` (read, not imported: the pod
    modules import what the package does not have, Ray or the pod's paths)."""
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise LookupError(f"{file_name} defines no {name}")
