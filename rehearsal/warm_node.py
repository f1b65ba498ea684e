"""A GPU node's disk as a warm node holds the weights: the checkpoint's files linked into the node
cache's folder that the serve config names, marked complete for a snapshot, and moto's S3 holding
that snapshot's ``hash`` and ``.manifest.json`` under the deployed prefix (no weights: a warm node
reads none). The deployed callback (``eks_pd_node_cache:NodeWeights``) then runs as on a node: it
reads the two small objects, checks each file's size against the manifest and serves the copy.

This is how the GPU fault rehearsal serves the real model's size (``--weights``, the 9B
``full-weights`` checkpoint) without pushing 17.5 GiB through moto. A node's first fill from S3 is
not rehearsed here (moto is not S3's throughput); docs/features/cold-start.md has it on paper.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from eks_pd_serving.k8s import serve_config as layout
from eks_pd_serving.phase import Phase
from eks_pd_serving.weights.node_cache import eks_pd_node_cache as node_cache

from . import profile
from .local_aws import CREDENTIALS, client, moto_server
from .s3_weights import BUCKET, prefix_of

# Each file's SHA-256, kept beside the checkpoint (keyed by size and mtime) so a second run skips it.
DIGESTS = ".eks-pd-digests.json"


def staged_uri(deployed: dict[str, Any]) -> str:
    """The local S3's URI for the deployed callback's source (the same prefix)."""
    llm = layout.llm_config(deployed, Phase.DECODE)
    callback = llm.get("callback_config")
    if not callback:
        raise ValueError("the deployed serve config has no node cache callback: synthesize with node_cache=true")
    return f"s3://{BUCKET}/{prefix_of(str(callback['callback_kwargs']['source']))}"


def manifest(checkpoint: Path) -> dict[str, dict[str, Any]]:
    """The staging job's manifest of ``checkpoint``: each file's size and SHA-256 (threads, one a file)."""
    files = sorted(p for p in checkpoint.iterdir() if p.is_file() and not p.name.startswith("."))
    cache_file = checkpoint / DIGESTS
    cached = json.loads(cache_file.read_text()) if cache_file.exists() else {}

    def one(path: Path) -> tuple[str, dict[str, Any]]:
        stat = path.stat()
        key = f"{stat.st_size}:{stat.st_mtime_ns}"
        if cached.get(path.name, {}).get("key") == key:
            return path.name, cached[path.name]
        with path.open("rb") as stream:
            digest = hashlib.file_digest(stream, "sha256").hexdigest()
        return path.name, {"bytes": stat.st_size, "sha256": digest, "key": key}

    with ThreadPoolExecutor(8) as pool:
        entries = dict(pool.map(one, files))
    cache_file.write_text(json.dumps(entries, indent=1, sort_keys=True))
    return {n: {"bytes": e["bytes"], "sha256": e["sha256"]} for n, e in entries.items()}


def _seed(folder: Path, checkpoint: Path, files: dict[str, dict[str, Any]], snapshot: str, uri: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in files:
        target = folder / name
        target.unlink(missing_ok=True)
        try:
            os.link(checkpoint / name, target)
        except OSError:  # another file system: the engine reads through a link as well
            target.symlink_to(checkpoint / name)
    record = {"snapshot": snapshot, "source": uri, "files": len(files),
              "bytes": sum(e["bytes"] for e in files.values()), "seconds": 0.0}  # fmt: skip
    (folder / node_cache.COMPLETE).write_text(json.dumps(record, sort_keys=True))


@contextlib.contextmanager
def warm_node(checkpoint: Path, rehearsed: dict[str, Any], port: int) -> Iterator[dict[str, str]]:
    """For the block: moto's S3 with the snapshot's small objects, each engine's node-cache folder
    seeded; yields the env Ray's processes need to reach that S3 (and Hugging Face offline)."""
    files = manifest(checkpoint)
    snapshot = uuid.uuid4().hex
    profile.forget_compile_marks()  # this moto holds no compile archive yet
    with moto_server(port) as endpoint:
        s3 = client("s3", endpoint)
        s3.create_bucket(Bucket=BUCKET)
        for _, llm in layout.phase_llm_configs(rehearsed):
            uri = str(llm["callback_config"]["callback_kwargs"]["source"])
            prefix = prefix_of(uri)
            s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{node_cache.HASH}", Body=snapshot.encode())
            s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{node_cache.MANIFEST}", Body=json.dumps({"files": files}))
            s3.put_object(Bucket=BUCKET, Key=f"{prefix}/.staged", Body=b"rehearsal")
            folder = Path(profile.on_this_machine(llm["model_loading_config"]["model_source"]))
            _seed(folder, checkpoint, files, snapshot, uri)
        yield {**CREDENTIALS, "AWS_ENDPOINT_URL_S3": endpoint, "HF_HUB_OFFLINE": "1"}
