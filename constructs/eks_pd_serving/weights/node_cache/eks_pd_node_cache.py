"""The checkpoint on the GPU node's own disk (pod-side: Ray Serve LLM's ``LLMConfig`` callback).

The serve config points each engine's ``model_source`` at a folder of the node cache (a hostPath on
the node's instance store, or its root volume) and names ``NodeWeights`` as its callback. Ray runs
the callback's ``on_before_download_model_files_distributed`` on every node of the replica's
placement group before the engine reads ``model_source`` (Ray 2.58,
``serve/utils/node_initialization_utils.py``). It makes that folder hold the staged revision:

- complete and of the staged snapshot (the ``hash`` object, a few bytes), each file of the size the
  staged manifest records (``.manifest.json``, a few KB): nothing else is read;
- missing, partial, of another snapshot or of other sizes: the files are copied from S3 into a folder
  beside it, each checked against the manifest's SHA-256, and renamed into place, so the engine never
  reads half a checkpoint, or one that is not the staged one, under its name;
- S3 unreachable, with a complete copy: the copy serves, and the log says so.

Where the callback runs: when every bundle of the replica's placement group is on the replica's own
node (a one-GPU engine, or tensor parallelism inside one node), ``on_before_node_init`` makes the
folder in the replica's own process and tells Ray to skip its per-node tasks (``run_init_node``):
each task is a new Ray worker that imports torch and Ray Serve LLM before it reaches the callback
(skipping them saved about 2.6 s of a replica's start on an H100: docs/features/cold-start.md). A placement group over
several nodes keeps Ray's tasks, one per node. ``EKS_PD_NODE_FILL_IN_REPLICA=0`` in the workers'
env turns the in-replica path off.

One fill at a time per folder on a node (an ``flock`` on the node's disk, which every pod there
shares); a replica that waited finds the copy complete. After a fill, the model's folders beyond the
newest ``KEEP`` are removed: a revision change has two in play, the old and the new.

The compile caches (vLLM's, TorchInductor's and Triton's folders, named by the workers' env
``COMPILE_ENV``) are shared through the same bucket when ``callback_kwargs`` names ``compiled`` (a
key under the bucket's ``compile/`` prefix, of the image and the engine's settings): before the
engine starts, a node that holds no copy of that archive extracts it (``fill_compiled``: files it
already has are kept, nothing outside the folders is written); after the engine started healthy
(``on_engine_started``, which the engine servers call), a node whose caches came from no archive
uploads them once (``share_compiled``: S3's conditional write, so the first node wins and nothing
is overwritten). So a new node compiles no kernel that another node of the same image and settings
already compiled.
Standard library and boto3 (which the image's Ray uses for its own S3 mirror).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

# Import path of the callback, as the serve config names it.
CALLBACK_CLASS = "eks_pd_node_cache:NodeWeights"
# The staging job's objects beside the files (weights/job/stage.py): not part of the checkpoint.
HASH = "hash"
# Each staged file's size and SHA-256, which a fill verifies and a reused copy is checked against by
# sizes (weights/job/stage.py's MANIFEST). Revisions staged before it have none: nothing to check.
MANIFEST = ".manifest.json"
SKIPPED = (".staged", ".staging-error", HASH, MANIFEST)
# Written last into a complete copy: the snapshot it holds, its files and how long the copy took.
COMPLETE = ".complete"
KEEP = 2
# The workers' env switch for the in-replica path ("0": Ray's per-node tasks, as before), and what
# the replica's log line ends with when it took that path.
IN_REPLICA_ENV = "EKS_PD_NODE_FILL_IN_REPLICA"
IN_REPLICA_LINE = "(in the replica: Ray's per-node download tasks skipped)"
# Files copied at once, and each file's ranged parts at once (boto3's transfer manager).
FILES_AT_ONCE = 8
PARTS_AT_ONCE = 8
# Free space left on the node's disk after a fill (kubelet evicts pods below 10% free).
FREE_MARGIN = 0.10
# The compile caches' folders (the workers' env names them, each under one folder of the image's
# key); an archive's members are named by the env name, so a node with other paths extracts right.
COMPILE_ENV = ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
# Beside the compile folders: this node's caches came from, or went to, the archive of that key.
SHARED_MARK = ".shared-{}"
COMPILE_LOCK = ".compile.lock"


class NodeCacheError(RuntimeError):
    """One line: what the fill could not do, where, and the fix."""


def _s3() -> Any:
    # boto3 reads the region and any endpoint (AWS_ENDPOINT_URL_S3: the rehearsal's) from the env.
    import boto3
    from boto3.s3.transfer import TransferConfig

    return boto3.client("s3"), TransferConfig(max_concurrency=PARTS_AT_ONCE)


def split(source: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` -> (bucket, "prefix/")."""
    if not source.startswith("s3://"):
        raise NodeCacheError(f"node cache: source {source!r} is not an s3:// URI")
    bucket, _, prefix = source.removeprefix("s3://").partition("/")
    return bucket, prefix.rstrip("/") + "/"


def complete_snapshot(folder: Path) -> str | None:
    """The snapshot a complete copy holds, or None."""
    try:
        return str(json.loads((folder / COMPLETE).read_text())["snapshot"])
    except (OSError, ValueError, KeyError):
        return None


def staged_snapshot(client: Any, bucket: str, prefix: str) -> str:
    """The snapshot id the staging job wrote beside the files (Ray's mirror reads the same)."""
    body: bytes = client.get_object(Bucket=bucket, Key=prefix + HASH)["Body"].read()
    return body.decode().strip()


def staged_manifest(client: Any, bucket: str, prefix: str) -> dict[str, dict[str, Any]] | None:
    """Each staged file's size and SHA-256, or None when the revision was staged without them."""
    try:
        body: bytes = client.get_object(Bucket=bucket, Key=prefix + MANIFEST)["Body"].read()
    except Exception as error:  # NoSuchKey (403 without s3:ListBucket): staged before manifests
        if "NoSuchKey" in str(error) or "AccessDenied" in str(error) or "404" in str(error):
            return None
        raise
    return dict(json.loads(body)["files"])


def off_sizes(folder: Path, manifest: dict[str, dict[str, Any]]) -> list[str]:
    """The files of ``folder`` whose size is not the manifest's (or that are missing)."""
    off = []
    for name, entry in sorted(manifest.items()):
        path = folder / name
        if not path.is_file() or path.stat().st_size != int(entry["bytes"]):
            off.append(name)
    return off


def _sha256(path: Path) -> str:
    with path.open("rb") as stream:  # Python 3.11+ (the image's is 3.13)
        return hashlib.file_digest(stream, "sha256").hexdigest()


def off_digests(folder: Path, manifest: dict[str, dict[str, Any]]) -> list[str]:
    """The files of ``folder`` whose SHA-256 is not the manifest's (read in ``FILES_AT_ONCE`` threads)."""
    names = sorted(manifest)
    with ThreadPoolExecutor(FILES_AT_ONCE) as pool:
        found = list(pool.map(lambda n: (folder / n).is_file() and _sha256(folder / n), names))
    return [n for n, digest in zip(names, found, strict=True) if digest != manifest[n]["sha256"]]


def _listing(client: Any, bucket: str, prefix: str) -> list[tuple[str, int]]:
    files = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            name = item["Key"][len(prefix) :]
            if name and not name.endswith("/") and name not in SKIPPED:
                files.append((name, int(item.get("Size", 0))))
    return files


def _check_room(folder: Path, needed: int) -> None:
    usage = shutil.disk_usage(folder)
    if usage.free - needed < usage.total * FREE_MARGIN:
        raise NodeCacheError(
            f"node cache: {folder} has {usage.free / 2**30:.1f} GiB free, the checkpoint needs "
            f"{needed / 2**30:.1f} GiB and 10% must stay free; give the GPU nodes a type with more instance "
            "storage or a larger gpu_root_volume_gib"
        )


def _copy(client: Any, transfer: Any, bucket: str, prefix: str, files: list[tuple[str, int]], into: Path) -> None:
    def one(name: str) -> None:
        target = into / name
        target.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(bucket, prefix + name, str(target), Config=transfer)

    with ThreadPoolExecutor(FILES_AT_ONCE) as pool:
        list(pool.map(one, [name for name, _ in files]))  # raises the first failed download


def prune(model_dir: Path, keep: int = KEEP, serving: Path | None = None) -> list[Path]:
    """Remove the model's complete copies beyond the newest ``keep`` (the most recently checked or
    filled) and leftovers of fills that died, never ``serving`` and never one whose lock another
    start holds; returns what was removed."""
    copies = sorted(
        (p for p in model_dir.iterdir() if p.is_dir() and complete_snapshot(p) is not None),
        key=lambda p: (p / COMPLETE).stat().st_mtime,
        reverse=True,
    )
    stale = [(p, p.name) for p in copies[keep:] if p != serving]
    stale += [(p, p.name.removeprefix(".fill-").rsplit("-", 1)[0]) for p in model_dir.iterdir()
              if p.is_dir() and p.name.startswith(".fill-")]  # fmt: skip
    removed = []
    for path, name in stale:
        with (model_dir / f"{name}.lock").open("a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # being checked or filled by another start
                continue
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def fill(source: str, folder: Path, *, keep: int = KEEP) -> str:
    """Make ``folder`` a complete copy of the staged revision at ``source``; returns one line
    saying what was done (reused, filled, or served stale)."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    bucket, prefix = split(source)
    client, transfer = _s3()
    with (folder.parent / f"{folder.name}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        have = complete_snapshot(folder)
        try:
            wanted = staged_snapshot(client, bucket, prefix)
        except Exception as error:
            if have is None:
                raise NodeCacheError(
                    f"node cache: cannot read {source}/{HASH} ({error}) and {folder} holds no copy"
                ) from error
            return f"node cache: {folder} serves snapshot {have} (S3 unreachable: {error})"
        try:
            manifest = staged_manifest(client, bucket, prefix)
        except Exception as error:
            if have != wanted:
                raise NodeCacheError(f"node cache: cannot read {source}/{MANIFEST} ({error})") from error
            return f"node cache: {folder} serves snapshot {have} (its manifest unreadable: {error})"
        if have == wanted:
            off = off_sizes(folder, manifest) if manifest is not None else []
            if not off:
                os.utime(folder / COMPLETE)
                checked = "sizes checked against the manifest" if manifest is not None else "no manifest staged"
                return f"node cache: {folder} holds snapshot {wanted}, no weights read from S3 ({checked})"
            print(f"node cache: {folder} differs from the manifest ({', '.join(off[:5])}): filled again",
                  file=sys.stderr, flush=True)  # fmt: skip
        started = time.monotonic()
        files = _listing(client, bucket, prefix)
        if not files:
            raise NodeCacheError(f"node cache: {source} lists no files; the weights are not staged there")
        size = sum(n for _, n in files)
        _check_room(folder.parent, size)
        partial = folder.parent / f".fill-{folder.name}-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        _copy(client, transfer, bucket, prefix, files, partial)
        if manifest is not None:
            off = off_digests(partial, manifest)
            if off:
                shutil.rmtree(partial, ignore_errors=True)
                raise NodeCacheError(
                    f"node cache: {source} holds files whose SHA-256 is not the staged manifest's "
                    f"({', '.join(off[:5])}); nothing was put in place. Fix: stage the revision again (delete its "
                    ".staged marker)"
                )
        seconds = time.monotonic() - started
        record = {
            "snapshot": wanted,
            "source": source,
            "files": len(files),
            "bytes": size,
            "seconds": round(seconds, 1),
        }
        (partial / COMPLETE).write_text(json.dumps(record, sort_keys=True))
        if folder.exists():
            shutil.rmtree(folder)
        partial.rename(folder)
        removed = prune(folder.parent, keep, serving=folder)
        gone = f"; removed {', '.join(p.name for p in removed)}" if removed else ""
        return (
            f"node cache: filled {folder} with snapshot {wanted} from {source}: {len(files)} files, "
            f"{size / 2**30:.2f} GiB in {seconds:.1f} s ({size / 2**20 / max(seconds, 1e-3):.0f} MiB/s), "
            f"{'SHA-256 verified' if manifest is not None else 'no manifest staged'}{gone}"
        )


def compile_folders(env: Any = os.environ) -> dict[str, Path]:
    """The compile caches' folders by env name (those the env sets)."""
    return {name: Path(env[name]) for name in COMPILE_ENV if env.get(name)}


@contextlib.contextmanager
def _marked(folders: dict[str, Path], key: str) -> Iterator[Path]:
    """This node's mark of the archive ``key`` (beside the compile folders), under the node's lock
    of its compile caches for the block: one fill or share at a time."""
    root = Path(os.path.commonpath([str(p) for p in folders.values()]))
    root.mkdir(parents=True, exist_ok=True)
    with (root / COMPILE_LOCK).open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield root / SHARED_MARK.format(hashlib.sha256(key.encode()).hexdigest()[:16])


def _mark(mark: Path, key: str, source: str, **more: Any) -> None:
    mark.write_text(json.dumps({"key": key, "from": source, **more}, sort_keys=True))


def _code(error: Exception) -> str:
    """S3's error code of a botocore ClientError ("" for any other error)."""
    return str(getattr(error, "response", {}).get("Error", {}).get("Code", ""))


def _missing(error: Exception) -> bool:
    """S3's answer for a key not there: 404 (the workers may list the bucket, so never a 403)."""
    return _code(error) in ("NoSuchKey", "404", "NotFound")


def fill_compiled(bucket: str, key: str, env: Any = os.environ) -> str:
    """Extract the shared archive ``key`` into this node's compile folders, once per node and key;
    files the node already has are kept. One line saying what was done."""
    folders = compile_folders(env)
    if not folders:
        return "compile caches: no folders in the env; nothing shared"
    with _marked(folders, key) as mark:
        if mark.exists():
            return f"compile caches: this node holds s3://{bucket}/{key} already"
        client, _ = _s3()
        started = time.monotonic()
        try:
            body = client.get_object(Bucket=bucket, Key=key)["Body"]
        except Exception as error:
            if _missing(error):
                return f"compile caches: none shared at s3://{bucket}/{key} yet; this start compiles and shares them"
            return f"compile caches: s3://{bucket}/{key} unreadable ({error}); this start compiles"
        try:
            written, skipped = _extract(body, folders)
        except Exception as error:  # a damaged archive: what was extracted stays, the engine compiles the rest
            _mark(mark, key, "s3", error=str(error))
            return f"compile caches: s3://{bucket}/{key} unreadable ({error}); this start compiles what is missing"
        _mark(mark, key, "s3", files=written)
        refused = f", {skipped} members skipped (not a file of the compile folders)" if skipped else ""
        return (f"compile caches: {written} files from s3://{bucket}/{key} in "
                f"{time.monotonic() - started:.1f} s{refused}")  # fmt: skip


def _extract(body: Any, folders: dict[str, Path]) -> tuple[int, int]:
    """The archive's regular files into their folders (members ``<ENV NAME>/<path>``), none over a
    file the node has; a member that is no regular file of a named folder, or that tarfile's ``data``
    filter refuses (``..``, an absolute path), is skipped. (written, skipped)."""
    import tarfile

    written = skipped = 0
    with tarfile.open(fileobj=body, mode="r|gz") as archive:
        for member in archive:
            name, _, rest = member.name.partition("/")
            rest = rest.lstrip("/")  # as the data filter reads it: inside the folder
            if name not in folders or not rest or not member.isfile():
                skipped += 1
                continue
            if (folders[name] / rest).exists():
                continue
            member.name = rest
            try:
                archive.extract(member, folders[name], filter="data")
            except tarfile.FilterError:
                skipped += 1
                continue
            written += 1
    return written, skipped


def _fill_compiled_line(bucket: str, key: str) -> str:
    """``fill_compiled``'s line, or why it did not fill: the compile caches never fail a start."""
    try:
        return fill_compiled(bucket, key)
    except Exception as error:
        return f"compile caches: not filled ({type(error).__name__}: {error}); this start compiles"


def share_compiled(bucket: str, key: str, env: Any = os.environ) -> str:
    """Upload this node's compile folders as the archive ``key`` unless this node's caches came from
    it or S3 has it; write-once (``If-None-Match: *``): the first node to share wins."""
    import tarfile
    import tempfile

    folders = compile_folders(env)
    if not folders:
        return "compile caches: no folders in the env; nothing shared"
    with _marked(folders, key) as mark:
        if mark.exists():
            return f"compile caches: s3://{bucket}/{key} holds this node's kernels already"
        client, _ = _s3()
        try:
            client.head_object(Bucket=bucket, Key=key)
            _mark(mark, key, "another node")
            return f"compile caches: s3://{bucket}/{key} was shared by another node"
        except Exception as error:
            if not _missing(error):
                raise
        started = time.monotonic()
        files = 0
        with tempfile.TemporaryFile(dir=mark.parent) as spool:
            with tarfile.open(fileobj=spool, mode="w:gz", compresslevel=1) as archive:
                for name, folder in sorted(folders.items()):
                    for path in sorted(folder.rglob("*")) if folder.is_dir() else []:
                        if path.is_file() and not path.is_symlink() and not path.name.endswith(".lock"):
                            try:
                                archive.add(path, arcname=f"{name}/{path.relative_to(folder)}", recursive=False)
                            except OSError:  # removed while walking (a kernel being replaced)
                                continue
                            files += 1
            if not files:
                return "compile caches: nothing compiled on this node yet; nothing shared"
            size = spool.tell()
            spool.seek(0)
            try:
                client.put_object(Bucket=bucket, Key=key, Body=spool, IfNoneMatch="*")
            except Exception as error:
                if _code(error) not in ("PreconditionFailed", "412"):  # the conditional write lost
                    raise
                _mark(mark, key, "another node")
                return f"compile caches: s3://{bucket}/{key} was shared by another node first"
        _mark(mark, key, "this node", files=files)
        return (f"compile caches: shared {files} files ({size / 2**20:.1f} MiB) as s3://{bucket}/{key} in "
                f"{time.monotonic() - started:.1f} s")  # fmt: skip


try:  # the pods (and the rehearsals) have Ray; the package's tests import fill() without it
    from ray.llm._internal.common.callbacks.base import CallbackBase
except ImportError:  # pragma: no cover - Ray-less import
    CallbackBase = object


def placement_nodes(placement_group: Any) -> set[str]:
    """The nodes a placement group's bundles are on (Ray's table; empty when there is none)."""
    import ray

    if placement_group is None:
        return set()
    return set(ray.util.placement_group_table(placement_group)["bundles_to_node_id"].values())


def _torch_kernels_folder() -> None:
    # What Ray's skipped task would have done first (download_model_files): torch cannot create its
    # kernels folder when the parent is missing. torch.hub's home without importing torch.
    home = os.environ.get("TORCH_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "torch"
    )
    os.makedirs(os.path.join(home, "kernels"), exist_ok=True)


class NodeWeights(CallbackBase):  # type: ignore[misc]
    """Ray's ``callback_config.callback_class``: ``callback_kwargs`` = {"source": "s3://bucket/prefix"};
    the folder is the LLMConfig's own ``model_source``."""

    async def on_before_node_init(self) -> None:
        import ray

        if os.environ.get(IN_REPLICA_ENV, "1") == "0":
            return
        here = ray.get_runtime_context().get_node_id()
        if placement_nodes(self.ctx.placement_group) != {here}:
            return  # bundles on other nodes: Ray's task on each fills that node's disk
        folder = Path(self.llm_config.model_loading_config.model_source)
        line = await asyncio.to_thread(fill, self.kwargs["source"], folder)
        await asyncio.to_thread(_torch_kernels_folder)
        self.ctx.run_init_node = False
        # Serve's replica logger: the line carries the replica's id and time, in the replica's log
        # file and on its stderr (Serve's default), which RAY_LOG_TO_STDERR puts in the pod's log,
        # where verify reads it and the start's split (observability/replica_start.py) too.
        logging.getLogger("ray.serve").info(f"{line} {IN_REPLICA_LINE}")
        compiled = self._compiled()
        if compiled:  # after the weights' line: the split's node_init ends at this one
            logging.getLogger("ray.serve").info(await asyncio.to_thread(_fill_compiled_line, *compiled))

    def _compiled(self) -> tuple[str, str] | None:
        """(bucket, key) of the shared compile archive, or None when the config shares none."""
        key = self.kwargs.get("compiled")
        return (split(self.kwargs["source"])[0], str(key)) if key else None

    async def on_engine_started(self) -> None:
        """After the engine started healthy (the engine servers call it): share the compile caches."""
        compiled = self._compiled()
        if compiled:
            try:
                line = await asyncio.to_thread(share_compiled, *compiled)
            except Exception as error:  # sharing is an optimization: the replica serves regardless
                line = f"compile caches: not shared ({type(error).__name__}: {error})"
            logging.getLogger("ray.serve").info(line)

    def on_before_download_model_files_distributed(self) -> None:
        folder = Path(self.llm_config.model_loading_config.model_source)
        # Ray runs this in a task of its own, whose loggers are not Serve's: stderr reaches the pod's
        # log (RAY_LOG_TO_STDERR), where verify reads it.
        print(fill(self.kwargs["source"], folder), file=sys.stderr, flush=True)
        compiled = self._compiled()
        if compiled:
            print(_fill_compiled_line(*compiled), file=sys.stderr, flush=True)
