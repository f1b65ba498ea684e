"""IAM policies as the controllers' upstream releases publish them (``policies/``, named in
``versions.py``), for the two controllers that need one."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any


def published_policy(file_name: str) -> dict[str, Any]:
    """The policy document a release publishes, as shipped in this package (unchanged)."""
    return dict(json.loads(resources.files("eks_pd_serving").joinpath(file_name).read_text()))
