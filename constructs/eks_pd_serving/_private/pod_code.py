"""The pods' programs (the key check, the GCS token reader, the KV guard) as the package ships them:
a file beside its package's ``__init__``, read exactly as the pods run it, and the short digest a pod
annotation carries, so new code changes the pod template on purpose. No CDK: the rehearsals import it."""

from __future__ import annotations

import hashlib
from pathlib import Path


def source(package_file: str, file_name: str) -> str:
    """The text of ``file_name`` beside ``package_file`` (a package's ``__file__``)."""
    return (Path(package_file).parent / file_name).read_text()


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]
