"""The node cache (``eks_pd_node_cache``, pod-side) and how it ships: its source goes into a
ConfigMap mounted on every GPU worker, on the pods' PYTHONPATH, and each engine's ``LLMConfig``
names its callback; the worker pods mount the node's disk at ``MOUNT_PATH``. The pod module's names
are read here from its text, so the package does not need Ray."""

from __future__ import annotations

import hashlib

from ..._private import pod_code

MODULE = "eks_pd_node_cache"
FILE_NAME = f"{MODULE}.py"
MOUNT_PATH = "/opt/eks-pd/node-cache"
# The node's disk: nodeadm's RAID0 array of the instance store's NVMe disks (amazon-eks-ami
# setup-local-disks: /mnt/k8s-disks/0); on a type without instance storage the kubelet creates the
# folder on the root volume (hostPath DirectoryOrCreate).
HOST_PATH = "/mnt/k8s-disks/0/eks-pd-serving"
# Where the worker container sees it.
CACHE_PATH = "/var/cache/eks-pd"
# The engines' compile caches in the weights bucket: one archive per image and engine settings
# (``shared_compile_cache``).
COMPILE_PREFIX = "compile"


_CODE = pod_code.Shipped(__file__, FILE_NAME)
source = _CODE.source
source_digest = _CODE.digest


def callback_class() -> str:
    return str(_CODE.constant("CALLBACK_CLASS"))


def compile_key(image: str) -> str:
    """The compile caches' folder key: a new image (vLLM, torch, Triton) never reads an old
    kernel; vLLM and Triton key their entries by the engine's settings and the kernels' source.
    Of the image's repository and tag alone: its registry host names the region, which synth may
    hold as a token (whose text changes from one synth to the next)."""
    return hashlib.sha256(image.rsplit("/", 1)[-1].encode()).hexdigest()[:16]


__all__ = [
    "CACHE_PATH",
    "COMPILE_PREFIX",
    "FILE_NAME",
    "HOST_PATH",
    "MODULE",
    "MOUNT_PATH",
    "callback_class",
    "compile_key",
    "source",
    "source_digest",
]
