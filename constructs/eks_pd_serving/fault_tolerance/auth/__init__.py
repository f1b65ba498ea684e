"""The Ray head's init container that reads the GCS store's auth token (``eks_pd_gcs_auth``,
pod-side) and how it ships: its source is the container's ``python -c`` program, and the token goes
to the Ray container through an env file on a memory-backed emptyDir (``fileKeyRef``)."""

from __future__ import annotations

from ..._private import pod_code
from .eks_pd_gcs_auth import FIELD, FILE_ENV, KEY, SECRET_ENV

FILE_NAME = "eks_pd_gcs_auth.py"
VOLUME = "gcs-auth"
MOUNT_PATH = "/run/eks-pd/gcs-auth"
ENV_FILE = "auth.env"


_CODE = pod_code.Shipped(__file__, FILE_NAME)
source = _CODE.source
source_digest = _CODE.digest


__all__ = ["ENV_FILE", "FIELD", "FILE_ENV", "KEY", "MOUNT_PATH", "SECRET_ENV", "VOLUME", "source", "source_digest"]
