"""The deployed weights path on this machine: moto's S3 server on 127.0.0.1 holds the checkpoint
under the deployed prefix, laid out as the staging job lays it (the files, ``hash``, ``.staged``);
the engines load it through the deployed serve config's ``model_source`` (Ray Serve LLM's S3
mirror, boto3), with Hugging Face offline and a cache of the run's own, so nothing else can
serve the model.
"""

from __future__ import annotations

import contextlib
import hashlib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eks_pd_serving.weights.node_cache import COMPILE_PREFIX

from . import profile
from .local_aws import CREDENTIALS, client, moto_server

# The deployed bucket is the stack's (its name is a CloudFormation Ref); here it is this one.
BUCKET = "rehearsal-model-weights"


@dataclass(frozen=True)
class StagedWeights:
    uri: str  # what the rehearsed serve config's model_source becomes
    env: dict[str, str]  # for Ray's workers: moto's endpoint, dummy credentials, HF offline
    sha: str  # the run's own snapshot id (the ``hash`` object)
    cache: Path  # the run's Hugging Face cache, where Ray's mirror writes the snapshot
    archives: Callable[[], list[str]] = list  # the compile archives the engines shared so far

    def snapshot(self, model_id: str) -> Path:
        """Where Ray's S3 mirror puts the files (huggingface_hub's cache layout)."""
        return self.cache / f"models--{model_id.replace('/', '--')}" / "snapshots" / self.sha

    def loaded_from_s3(self, model_id: str, checkpoint: Path, node_copy: Path | None = None) -> bool:
        """Ray's mirror wrote this run's snapshot (or the node cache filled ``node_copy`` with it),
        byte for byte the checkpoint's weights."""
        weights = sorted(checkpoint.glob("*.safetensors"))
        folder = self.snapshot(model_id)
        if node_copy is not None:
            from eks_pd_serving.weights.node_cache import eks_pd_node_cache

            if eks_pd_node_cache.complete_snapshot(node_copy) != self.sha:
                return False
            folder = node_copy
        copies = [folder / w.name for w in weights]
        return bool(weights) and all(
            c.is_file() and _digest(c) == _digest(w) for c, w in zip(copies, weights, strict=True)
        )


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def prefix_of(model_source: str) -> str:
    """The deployed ``s3://<bucket>/<prefix>``'s prefix."""
    return model_source.removeprefix("s3://").split("/", 1)[1]


@contextlib.contextmanager
def staged(checkpoint: Path, deployed_source: str, work: Path, port: int) -> Iterator[StagedWeights]:
    """moto's S3 server with ``checkpoint`` staged under the deployed prefix, for the block."""
    profile.forget_compile_marks()  # this moto holds no compile archive yet
    with moto_server(port) as endpoint:
        s3 = client("s3", endpoint)
        s3.create_bucket(Bucket=BUCKET)
        prefix, sha = prefix_of(deployed_source), uuid.uuid4().hex
        for path in sorted(p for p in checkpoint.iterdir() if p.is_file()):
            s3.upload_file(str(path), BUCKET, f"{prefix}/{path.name}")
        s3.put_object(Bucket=BUCKET, Key=f"{prefix}/hash", Body=sha.encode())
        s3.put_object(Bucket=BUCKET, Key=f"{prefix}/.staged", Body=b"rehearsal")
        cache = work / f"hf-cache-{sha[:8]}"
        cache.mkdir(parents=True, exist_ok=True)
        env = {**CREDENTIALS, "AWS_ENDPOINT_URL_S3": endpoint, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
        yield StagedWeights(uri=f"s3://{BUCKET}/{prefix}", env=env, sha=sha, cache=cache,
                            archives=lambda: _compile_archives(s3))  # fmt: skip


def _compile_archives(s3: Any) -> list[str]:
    """The compile archives the run's engines shared (the node cache's ``share_compiled``)."""
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{COMPILE_PREFIX}/").get("Contents", [])
    return sorted(str(item["Key"]) for item in listed)
