"""The pods' programs (the key check, the GCS token reader, the KV guard) as the package ships them:
a file beside its package's ``__init__``, read exactly as the pods run it, and the short digest a pod
annotation carries, so new code changes the pod template on purpose. No CDK: the rehearsals import it."""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any


def source(package_file: str, file_name: str) -> str:
    """The text of ``file_name`` beside ``package_file`` (a package's ``__file__``)."""
    return (Path(package_file).parent / file_name).read_text()


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Shipped:
    """One pod program as its package's face hands it on: ``file_name`` beside ``package_file``
    (the package's ``__file__``), its text, its digest and its module-level literals."""

    package_file: str
    file_name: str

    def source(self) -> str:
        """The module's text, exactly as the pods run it."""
        return source(self.package_file, self.file_name)

    def digest(self) -> str:
        """Short digest of the source: a pod annotation, so new code restarts the pods on purpose."""
        return digest(self.source())

    @cached_property
    def _assigned(self) -> dict[str, ast.expr]:
        """Each module-level ``name = ...``'s value node, parsed once."""
        tree = ast.parse(self.source())
        found: dict[str, ast.expr] = {}
        for node in (n for n in tree.body if isinstance(n, ast.Assign)):
            for target in (t for t in node.targets if isinstance(t, ast.Name)):
                found.setdefault(target.id, node.value)
        return found

    def constant(self, name: str) -> Any:
        """The literal the module assigns to ``name`` (read, not imported: the pod modules import
        what the package does not have, Ray or the pod's paths)."""
        if name not in self._assigned:
            raise LookupError(f"{self.file_name} defines no {name}")
        return ast.literal_eval(self._assigned[name])
