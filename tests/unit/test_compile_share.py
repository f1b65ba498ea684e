"""The compile caches shared through the weights bucket (``eks_pd_node_cache.share_compiled`` and
``fill_compiled``, pod-side) against moto's S3: the first node to start healthy shares its folders
once, a new node extracts them before its engine starts and keeps what it has, a second sharer
never overwrites the first (S3's conditional write), and nothing of an archive lands outside the
folders."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from support import moto_aws

from eks_pd_serving.weights.node_cache import eks_pd_node_cache as cache

BUCKET = "weights"
KEY = "compile/6f36e7550484b70a/fe7e2d093a64ecf8.tar.gz"
# What a first start leaves in the three folders (names as vLLM, TorchInductor and Triton write them).
COMPILED = {
    "VLLM_CACHE_ROOT": {"torch_compile_cache/ab12/rank_0_0/backbone/model.py": b"graph",
                        "torch_compile_cache/ab12/rank_0_0/backbone/cache_key_factors.json": b"{}"},
    "TORCHINDUCTOR_CACHE_DIR": {"fxgraph/xy/entry": b"inductor"},
    "TRITON_CACHE_DIR": {"K3L/_gdn_kernel.cubin": b"\x7fELF", "K3L/_gdn_kernel.json": b"{\"name\": 1}"},
}  # fmt: skip


def node(root: Path, files: dict[str, dict[str, bytes]] | None = None) -> dict[str, str]:
    """A node's env naming its compile folders under ``root`` (the image's key folder), with ``files``."""
    env = {name: str(root / name.lower()) for name in cache.COMPILE_ENV}
    for name, entries in (files or {}).items():
        for rel, body in entries.items():
            path = Path(env[name]) / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(body)
    return env


def contents(env: dict[str, str]) -> dict[str, dict[str, bytes]]:
    found: dict[str, dict[str, bytes]] = {}
    for name in cache.COMPILE_ENV:
        folder = Path(env[name])
        entries = {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
        if entries:
            found[name] = entries
    return found


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    with moto_aws(monkeypatch):
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        boto3.setup_default_session(region_name="us-east-1")
        yield client


def test_a_new_node_gets_the_first_nodes_kernels(s3: Any, tmp_path: Path) -> None:
    first = node(tmp_path / "a", COMPILED)
    line = cache.fill_compiled(BUCKET, KEY, first)
    assert "none shared" in line and "this start compiles" in line
    assert "shared 5 files" in cache.share_compiled(BUCKET, KEY, first)
    fresh = node(tmp_path / "b")
    assert "5 files from" in cache.fill_compiled(BUCKET, KEY, fresh)
    assert contents(fresh) == COMPILED


def test_each_node_reads_and_writes_the_archive_once(s3: Any, tmp_path: Path) -> None:
    first = node(tmp_path / "a", COMPILED)
    cache.share_compiled(BUCKET, KEY, first)
    assert "already" in cache.share_compiled(BUCKET, KEY, first)  # a restart on the same node
    assert "already" in cache.fill_compiled(BUCKET, KEY, first)
    fresh = node(tmp_path / "b")
    cache.fill_compiled(BUCKET, KEY, fresh)
    s3.delete_object(Bucket=BUCKET, Key=KEY)  # the node does not read it again
    assert "already" in cache.fill_compiled(BUCKET, KEY, fresh)
    assert "already" in cache.share_compiled(BUCKET, KEY, fresh)  # filled from it: nothing to give back


def test_the_first_sharer_wins_and_nothing_is_overwritten(
    s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = node(tmp_path / "a", COMPILED)
    other = node(tmp_path / "b", {"TRITON_CACHE_DIR": {"other/kernel.cubin": b"other"}})
    # Both started from nothing at once: both looked, neither found an archive.
    assert "none shared" in cache.fill_compiled(BUCKET, KEY, first)
    assert "none shared" in cache.fill_compiled(BUCKET, KEY, other)
    cache.share_compiled(BUCKET, KEY, first)
    s3_body = s3.get_object(Bucket=BUCKET, Key=KEY)["Body"].read()
    # The second sharer sees the archive (HEAD) and keeps its own; S3's conditional write holds even
    # when the HEAD raced: the put itself is refused (PreconditionFailed).
    assert "another node" in cache.share_compiled(BUCKET, KEY, other)
    third = node(tmp_path / "c", {"TRITON_CACHE_DIR": {"third/kernel.cubin": b"third"}})
    client, transfer = cache._s3()
    client.head_object = lambda **_: (_ for _ in ()).throw(_not_found())  # the race: HEAD said missing
    monkeypatch.setattr(cache, "_s3", lambda: (client, transfer))
    assert "shared by another node first" in cache.share_compiled(BUCKET, KEY, third)
    assert s3.get_object(Bucket=BUCKET, Key=KEY)["Body"].read() == s3_body


def _not_found() -> Exception:
    from botocore.exceptions import ClientError

    error: Exception = ClientError({"Error": {"Code": "404", "Message": "Not Found"}}, "HeadObject")
    return error


def test_a_node_keeps_the_kernels_it_has(s3: Any, tmp_path: Path) -> None:
    cache.share_compiled(BUCKET, KEY, node(tmp_path / "a", COMPILED))
    own = {"TRITON_CACHE_DIR": {"K3L/_gdn_kernel.cubin": b"this node's"}}
    fresh = node(tmp_path / "b", own)
    assert "4 files from" in cache.fill_compiled(BUCKET, KEY, fresh)
    assert contents(fresh)["TRITON_CACHE_DIR"]["K3L/_gdn_kernel.cubin"] == b"this node's"


def test_nothing_of_an_archive_lands_outside_the_folders(s3: Any, tmp_path: Path) -> None:
    """A member with ``..``, an absolute path, a link or a folder no env names is not extracted."""
    spool = io.BytesIO()
    with tarfile.open(fileobj=spool, mode="w:gz") as archive:
        for name, body in {"TRITON_CACHE_DIR/../../escaped": b"x", "TRITON_CACHE_DIR//etc/owned": b"x",
                           "HOME/.bashrc": b"x", "TRITON_CACHE_DIR/ok/kernel.cubin": b"ok"}.items():  # fmt: skip
            info = tarfile.TarInfo(name)
            info.size = len(body)
            archive.addfile(info, io.BytesIO(body))
        link = tarfile.TarInfo("TRITON_CACHE_DIR/link")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        archive.addfile(link)
    s3.put_object(Bucket=BUCKET, Key=KEY, Body=spool.getvalue())
    fresh = node(tmp_path / "node" / "key")
    assert "2 files from" in (line := cache.fill_compiled(BUCKET, KEY, fresh)) and "3 members skipped" in line
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file() or p.is_symlink())
    kernels = [p for p in written if not p.startswith("node/key/.")]  # the lock and the node's mark
    assert kernels == ["node/key/triton_cache_dir/etc/owned", "node/key/triton_cache_dir/ok/kernel.cubin"]
    assert len(written) == len(kernels) + 2


def test_a_damaged_archive_fails_no_start(s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s3.put_object(Bucket=BUCKET, Key=KEY, Body=b"\x1f\x8b not gzip")
    fresh = node(tmp_path / "b")
    assert "unreadable" in cache.fill_compiled(BUCKET, KEY, fresh)
    for name, value in fresh.items():  # the callback's own reading of the env
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(cache, "fill_compiled", lambda *_: 1 / 0)
    assert "not filled (ZeroDivisionError" in cache._fill_compiled_line(BUCKET, KEY)


def test_a_node_with_no_folders_in_its_env_shares_nothing(s3: Any) -> None:
    assert "nothing shared" in cache.share_compiled(BUCKET, KEY, {})
    assert "nothing shared" in cache.fill_compiled(BUCKET, KEY, {})
    assert s3.list_objects_v2(Bucket=BUCKET).get("KeyCount") == 0
