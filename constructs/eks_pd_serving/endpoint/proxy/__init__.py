"""What every Serve proxy checks (``eks_pd_api_keys``, pod-side code: the body's bound, and API keys
when on) and how it is shipped: the module's source goes into a ConfigMap mounted on every Ray pod,
on the pods' PYTHONPATH. The module keeps its first name: running pods mount it by that name."""

from __future__ import annotations

from ..._private import pod_code
from .eks_pd_api_keys import DROPPED_LINE, MAX_BODY_ENV, MAX_STALE_ENV, REFRESH_ENV, SECRET_ENV, UNREAD_LINE

MODULE = "eks_pd_api_keys"
# Ray Serve's hook: each HTTP proxy calls this at start and wraps itself in what it returns.
CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
CALLBACK = f"{MODULE}:middlewares"
MOUNT_PATH = "/opt/eks-pd/python"
FILE_NAME = f"{MODULE}.py"


_CODE = pod_code.Shipped(__file__, FILE_NAME)
source = _CODE.source
source_digest = _CODE.digest


__all__ = [
    "CALLBACK",
    "CALLBACK_ENV",
    "DROPPED_LINE",
    "FILE_NAME",
    "MAX_BODY_ENV",
    "MAX_STALE_ENV",
    "MODULE",
    "MOUNT_PATH",
    "REFRESH_ENV",
    "SECRET_ENV",
    "UNREAD_LINE",
    "source",
]
