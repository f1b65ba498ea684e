"""Stage a Hugging Face model revision into S3, once: the staging job's script (CodeBuild).

    python stage.py   (MODEL, REVISION, BUCKET, PREFIX from the environment; HF_TOKEN for gated models)

File by file (download one, upload it, delete it), so the job's disk holds one shard at a time
whatever the model's size. Skipped when ``<prefix>/.staged`` exists. A failure writes one line
(model, revision, HTTP status, the fix) to ``<prefix>/.staging-error`` for the deploy's custom
resource to report, and exits 1. ``<prefix>/hash`` holds the commit staged, where Ray Serve LLM's S3
mirror looks for it; ``<prefix>/.manifest.json`` each file's size and SHA-256, which the node cache
checks a copy against. The token is never printed. Standard library, boto3 and
huggingface_hub only: it runs unchanged in the job and in the tests.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

MARKER = ".staged"
ERROR = ".staging-error"
# Ray Serve LLM's S3 mirror reads the snapshot id from this object (ray 2.58,
# llm/_internal/common/utils/cloud_utils.py, CloudFileSystem.download_model).
HASH = "hash"
# Each staged file's size and SHA-256 ({"files": {name: {"bytes": n, "sha256": hex}}}): what a node's
# copy is checked against (weights/node_cache). Written before ``hash``.
MANIFEST = ".manifest.json"
# What an engine loads: weights as safetensors, configs, tokenizer files, chat templates. Not the
# original/ consolidated checkpoints some repositories also carry (Llama: 16 GB more).
PATTERNS = ("*.safetensors", "*.json", "*.txt", "*.model", "*.tiktoken", "*.jinja", "*.py")
EXCLUDED = ("original/*", "*/original/*")


class StagingFailed(Exception):
    """One line naming the model, the revision, what Hugging Face answered and the fix."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def wanted(files: Sequence[str]) -> list[str]:
    return sorted(
        f
        for f in files
        if any(fnmatch.fnmatch(f, p) for p in PATTERNS) and not any(fnmatch.fnmatch(f, e) for e in EXCLUDED)
    )


def _reason(error: Exception, model: str, revision: str, token: bool) -> str:
    """What to tell the deployer about a Hugging Face error (huggingface_hub's own classes)."""
    from huggingface_hub import errors

    response = getattr(error, "response", None)
    status = getattr(response, "status_code", None)
    answered = f"Hugging Face answered HTTP {status}" if status else f"Hugging Face failed ({type(error).__name__})"
    where = f"{model} at revision {revision}"
    if isinstance(error, errors.GatedRepoError):
        fix = (
            "accept the model's licence on huggingface.co with the token's account"
            if token
            else ("set hf_token_secret to a Secrets Manager secret holding a token with access")
        )
        return f"{where} is gated: {answered}. Fix: {fix}"
    if isinstance(error, errors.RevisionNotFoundError):
        return f"{where}: no such revision ({answered}). Fix: set model_revision to a commit, branch or tag of it"
    if isinstance(error, errors.RepositoryNotFoundError):
        return f"{where}: no such repository, or it is private ({answered}). Fix: check model_source" + (
            "" if token else ", or set hf_token_secret for a private one"
        )
    return f"{where}: {answered}. Fix: retry the deploy; if it persists, check huggingface.co's status"


def stage(
    s3: Any,
    *,
    model: str,
    revision: str,
    bucket: str,
    prefix: str,
    token: str | None,
    api: Any | None = None,
    download: Callable[..., str] | None = None,
    log: Callable[[str], None] = print,
) -> str:
    """Copy ``model`` at ``revision`` to ``s3://bucket/prefix/``; return what was done. ``api`` and
    ``download`` default to huggingface_hub's HfApi and hf_hub_download."""
    from botocore.exceptions import ClientError

    try:
        marker = s3.get_object(Bucket=bucket, Key=f"{prefix}/{MARKER}")["Body"].read().decode()
        log(f"already staged: s3://{bucket}/{prefix}/ ({marker})")
        return "skipped"
    except ClientError as error:
        if error.response["Error"]["Code"] not in ("NoSuchKey", "404"):
            raise
    if api is None or download is None:
        from huggingface_hub import HfApi, hf_hub_download

        api, download = api or HfApi(), download or hf_hub_download
    try:
        info = api.model_info(model, revision=revision, token=token, files_metadata=False)
        files = wanted([s.rfilename for s in info.siblings or []])
        if not any(f.endswith(".safetensors") for f in files):
            raise StagingFailed(
                f"{model} at revision {revision} has no .safetensors weights (the engines load only those). "
                "Fix: choose a revision or repository that publishes safetensors"
            )
        log(f"staging {model}@{info.sha} ({len(files)} files) into s3://{bucket}/{prefix}/")
        manifest: dict[str, dict[str, Any]] = {}
        with tempfile.TemporaryDirectory() as work:
            for name in files:
                local = download(model, name, revision=info.sha, token=token, local_dir=work)
                manifest[name] = {"bytes": Path(local).stat().st_size, "sha256": sha256_of(Path(local))}
                s3.upload_file(local, bucket, f"{prefix}/{name}")
                Path(local).unlink()
                log(f"  {name}")
    except StagingFailed:
        raise
    except Exception as error:  # huggingface_hub's HTTP errors, network errors
        from huggingface_hub import errors

        if isinstance(error, errors.HfHubHTTPError | OSError):
            raise StagingFailed(_reason(error, model, revision, token is not None)) from None
        raise
    s3.put_object(Bucket=bucket, Key=f"{prefix}/{MANIFEST}", Body=json.dumps({"files": manifest}, sort_keys=True))
    s3.put_object(Bucket=bucket, Key=f"{prefix}/{HASH}", Body=str(info.sha).encode())
    s3.put_object(Bucket=bucket, Key=f"{prefix}/{MARKER}", Body=json.dumps({"model": model, "sha": info.sha}))
    return "staged"


def main(s3: Any = None, api: Any = None, download: Callable[..., str] | None = None) -> int:
    """The job: its settings from the environment; the clients default to boto3's and Hugging Face's."""
    if s3 is None:
        import boto3

        s3 = boto3.client("s3")
    env = os.environ
    bucket, prefix = env["BUCKET"], env["PREFIX"]
    try:
        stage(s3, model=env["MODEL"], revision=env["REVISION"], bucket=bucket, prefix=prefix,
              token=env.get("HF_TOKEN") or None, api=api, download=download)  # fmt: skip
    except StagingFailed as failed:
        print(f"STAGING FAILED: {failed}")
        s3.put_object(Bucket=bucket, Key=f"{prefix}/{ERROR}", Body=str(failed).encode())
        return 1
    s3.delete_object(Bucket=bucket, Key=f"{prefix}/{ERROR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
