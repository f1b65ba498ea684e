"""The node cache's fill (``eks_pd_node_cache.fill``, pod-side) against moto's S3, with every S3
call it sends recorded: a node reads the weights once per revision, a restart reads only the
``hash`` object, a new snapshot refills, two revisions are kept, nothing half-written is served."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from support import moto_aws

from eks_pd_serving.cli import verify
from eks_pd_serving.weights.node_cache import eks_pd_node_cache as cache

BUCKET = "weights"
PREFIX = "models/Qwen/Qwen3.5-9B/main"
SOURCE = f"s3://{BUCKET}/{PREFIX}"
FILES = {"model-00001-of-00002.safetensors": b"a" * 70_000, "model-00002-of-00002.safetensors": b"b" * 9_000,
         "config.json": b"{}", "tokenizer.json": b"{\"t\": 1}"}  # fmt: skip


def stage(s3: Any, prefix: str, snapshot: bytes, manifest: bool = True) -> None:
    """The checkpoint's files under ``prefix`` as the staging writes them, with its manifest (each
    file's size and SHA-256: ``stage.MANIFEST``) and its ``hash``."""
    for name, body in FILES.items():
        s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{name}", Body=body)
    if manifest:
        files = {n: {"bytes": len(b), "sha256": hashlib.sha256(b).hexdigest()} for n, b in FILES.items()}
        s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{cache.MANIFEST}", Body=json.dumps({"files": files}))
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}/hash", Body=snapshot)


@pytest.fixture
def s3_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, str]]]:
    """moto's S3 with the staged layout (the files, ``hash``, ``.staged``); yields every call the
    default session's clients send, as (operation, key)."""
    calls: list[tuple[str, str]] = []
    with moto_aws(monkeypatch):
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        stage(s3, PREFIX, b"snapshot-1\n")
        s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}/.staged", Body=b"x")
        boto3.setup_default_session(region_name="us-east-1")
        assert boto3.DEFAULT_SESSION is not None

        def record(params: dict[str, Any], model: Any, **_: Any) -> None:
            calls.append((model.name, params.get("Key") or params.get("Prefix", "")))

        boto3.DEFAULT_SESSION.events.register("provide-client-params.s3.*", record)
        yield calls


def _weights_read(calls: list[tuple[str, str]]) -> list[str]:
    skipped = ("/hash", f"/{cache.MANIFEST}")
    return [key for op, key in calls if op in ("GetObject", "HeadObject") and not key.endswith(skipped)]


def test_a_node_fills_once_and_a_restart_reads_no_weights(tmp_path: Path, s3_calls: list[tuple[str, str]]) -> None:
    folder = tmp_path / "weights" / "Qwen--Qwen3.5-9B" / "main"
    line = cache.fill(SOURCE, folder)
    assert line.startswith(f"node cache: filled {folder} with snapshot snapshot-1 from {SOURCE}: 4 files")
    assert "SHA-256 verified" in line
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.name != cache.COMPLETE} == FILES
    assert json.loads((folder / cache.COMPLETE).read_text())["snapshot"] == "snapshot-1"
    assert sorted(_weights_read(s3_calls)) != []
    s3_calls.clear()
    again = cache.fill(SOURCE, folder)
    assert again == (
        f"node cache: {folder} holds snapshot snapshot-1, no weights read from S3 (sizes checked against the manifest)"
    )
    assert _weights_read(s3_calls) == []
    assert s3_calls == [("GetObject", f"{PREFIX}/hash"), ("GetObject", f"{PREFIX}/{cache.MANIFEST}")]
    # verify reads these two lines out of a worker's log (its cold-start split).
    patterns = verify._COLD_START_LINES
    assert patterns["filled"][0].search(line) and patterns["reused"][0].search(again)


def test_a_new_snapshot_refills_and_two_revisions_are_kept(tmp_path: Path, s3_calls: list[tuple[str, str]]) -> None:
    model = tmp_path / "weights" / "Qwen--Qwen3.5-9B"
    s3 = boto3.client("s3")
    for revision in ("r1", "r2", "r3"):
        stage(s3, f"models/x/{revision}", revision.encode())
        cache.fill(f"s3://{BUCKET}/models/x/{revision}", model / revision)
    assert sorted(p.name for p in model.iterdir() if p.is_dir()) == ["r2", "r3"]
    # The same revision re-staged with another snapshot: filled again, in place.
    s3.put_object(Bucket=BUCKET, Key="models/x/r3/hash", Body=b"r3-again")
    assert "filled" in cache.fill(f"s3://{BUCKET}/models/x/r3", model / "r3")
    assert cache.complete_snapshot(model / "r3") == "r3-again"


def test_s3_unreachable_serves_a_complete_copy_and_refuses_without_one(
    tmp_path: Path, s3_calls: list[tuple[str, str]]
) -> None:
    folder = tmp_path / "main"
    cache.fill(SOURCE, folder)
    s3 = boto3.client("s3")
    s3.delete_object(Bucket=BUCKET, Key=f"{PREFIX}/hash")
    assert "serves snapshot snapshot-1 (S3 unreachable" in cache.fill(SOURCE, folder)
    with pytest.raises(cache.NodeCacheError, match="holds no copy"):
        cache.fill(SOURCE, tmp_path / "other")


def test_a_full_disk_is_refused_before_anything_is_written(
    tmp_path: Path, s3_calls: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("shutil.disk_usage", lambda _: type("U", (), {"total": 100_000, "free": 50_000})())
    with pytest.raises(cache.NodeCacheError, match=r"10% must stay free; give the GPU nodes a type"):
        cache.fill(SOURCE, tmp_path / "main")
    assert [p.name for p in tmp_path.iterdir()] == ["main.lock"]
    assert _weights_read(s3_calls) == []


def test_replicas_starting_together_fill_once(tmp_path: Path, s3_calls: list[tuple[str, str]]) -> None:
    folder = tmp_path / "main"
    lines: list[str] = []
    threads = [threading.Thread(target=lambda: lines.append(cache.fill(SOURCE, folder))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum("filled" in line for line in lines) == 1
    assert sum("no weights read from S3" in line for line in lines) == 2
    assert len([k for k in _weights_read(s3_calls) if k.endswith(".safetensors")]) >= 2  # one fill's reads
    assert sorted(p.name for p in tmp_path.iterdir()) == ["main", "main.lock"]


def test_the_callback_names_what_the_serve_config_imports() -> None:
    from eks_pd_serving.weights import node_cache

    assert node_cache.callback_class() == f"{node_cache.MODULE}:{cache.NodeWeights.__name__}"
    assert cache.split(SOURCE) == (BUCKET, PREFIX + "/")


def test_a_copy_another_start_holds_is_not_removed(tmp_path: Path, s3_calls: list[tuple[str, str]]) -> None:
    import fcntl

    model = tmp_path / "weights" / "m"
    s3 = boto3.client("s3")
    for revision in ("r1", "r2", "r3"):
        stage(s3, f"models/m/{revision}", revision.encode())
    for revision in ("r1", "r2"):
        cache.fill(f"s3://{BUCKET}/models/m/{revision}", model / revision)
    with (model / "r1.lock").open("a") as held:  # another start is checking r1 right now
        fcntl.flock(held, fcntl.LOCK_EX)
        cache.fill(f"s3://{BUCKET}/models/m/r3", model / "r3")
    assert sorted(p.name for p in model.iterdir() if p.is_dir()) == ["r1", "r2", "r3"]
    assert cache.prune(model) == [model / "r1"]  # removed once nothing holds it


def test_a_reused_copy_of_other_sizes_is_filled_again(tmp_path: Path, s3_calls: list[tuple[str, str]]) -> None:
    """A copy its ``.complete`` calls good but whose file another writer changed (a worker mounts the
    node's disk read-write): its size is not the manifest's, so it is filled again from S3."""
    folder = tmp_path / "main"
    cache.fill(SOURCE, folder)
    (folder / "config.json").write_bytes(b'{"tampered": true}')
    line = cache.fill(SOURCE, folder)
    assert "filled" in line and "SHA-256 verified" in line
    assert (folder / "config.json").read_bytes() == FILES["config.json"]


def test_a_fill_whose_files_are_not_the_manifests_is_refused_and_puts_nothing_in_place(
    tmp_path: Path, s3_calls: list[tuple[str, str]]
) -> None:
    """The bucket's file changed after staging (same size, other bytes): its SHA-256 is not the
    manifest's; nothing is put in place under the folder's name."""
    boto3.client("s3").put_object(Bucket=BUCKET, Key=f"{PREFIX}/config.json", Body=b"[]")
    with pytest.raises(cache.NodeCacheError, match=r"SHA-256 is not the staged manifest's \(config.json\)"):
        cache.fill(SOURCE, tmp_path / "main")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["main.lock"]


def test_a_revision_staged_without_a_manifest_is_served_and_says_so(
    tmp_path: Path, s3_calls: list[tuple[str, str]]
) -> None:
    stage(boto3.client("s3"), "models/old/main", b"old", manifest=False)
    folder = tmp_path / "old"
    assert "no manifest staged" in cache.fill(f"s3://{BUCKET}/models/old/main", folder)
    assert "no manifest staged" in cache.fill(f"s3://{BUCKET}/models/old/main", folder)


def test_the_fill_and_the_staging_name_the_same_manifest() -> None:
    from eks_pd_serving.weights.job import stage as staging

    assert cache.MANIFEST == staging.MANIFEST and cache.MANIFEST in cache.SKIPPED
