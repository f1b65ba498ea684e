"""A replica's start split into its parts (observability/replica_start.py) from logs captured on an
H100 with the image's stack (Ray 2.58, vLLM 0.26) and on this CPU (Ray 2.60): the run's output (the
engines' lines) and Serve's controller and replica log files, as the rehearsal and verify read them."""

from __future__ import annotations

import gzip
import tarfile
from pathlib import Path

import pytest

from eks_pd_serving.observability import replica_start
from eks_pd_serving.weights.node_cache import eks_pd_node_cache

RUNS = Path(__file__).resolve().parents[2] / "docs" / "gpu-runs"


def captured(run: str) -> list[str]:
    folder = RUNS / run
    lines: list[str] = []
    if (folder / "run.log.gz").exists():
        with gzip.open(folder / "run.log.gz", "rt", errors="replace") as text:
            lines = text.read().splitlines()
    with tarfile.open(folder / "serve-logs.tgz") as archive:
        for member in archive.getmembers():
            data = archive.extractfile(member) if member.isfile() else None
            if data is not None:
                lines += data.read().decode(errors="replace").splitlines()
    return lines


def by_replica(lines: list[str]) -> dict[str, replica_start.ReplicaStart]:
    return {s.replica: s for s in replica_start.replica_starts(lines)}


def test_a_decode_setting_change_splits_into_every_part_on_the_gpu() -> None:
    # 2026-12-06, one H100, tiny model, caches warm: a decode engine setting changed.
    decode = by_replica(captured("2026-12-06/gpu-updates-both-phases"))["33zto5y6"]
    assert (decode.app, decode.phase, decode.node_init_how, decode.paired_by_time) == (
        "pd-decode", "Decode", "ray tasks", False,
    )  # fmt: skip
    assert decode.parts() == {
        "serve_saw": 0.1,  # "Deploying new version" to "Starting Replica"
        "actor": 29.1,  # to "Started initializing replica"
        "node_init": None,  # Ray's per-node download tasks: their end is not logged
        "engine_config": 27.9,  # those tasks and Ray's engine-config task, to "Clearing the current platform cache"
        "engine_process": 19.8,  # to vLLM's "Initializing a V1 LLM engine" (second resolution)
        "executor_worker": 23.0,  # to the Ray worker's "world_size=1 rank=0"
        "weights": 0.19529,  # vLLM's "Model loading took 0.01 GiB memory and 0.195290 seconds"
        "engine_init": 3.59,  # vLLM's "init engine (...) took 3.59 s"
        "to_running": 7.7,
        "total": 111.3,  # to Serve's "started successfully"
    }
    assert decode.line().startswith("Decode replica 33zto5y6: 111.3 s to RUNNING (node init: ray tasks): ")


def test_a_killed_replica_is_timed_from_the_crash_serve_saw() -> None:
    # 2026-12-05, one H100: the decode replica's process killed; Serve saw the actor crash.
    starts = by_replica(captured("2026-12-05/failover-decode"))
    again = starts["sq10wyot"]
    assert again.seen is not None and again.seen.isoformat() == "2026-12-05T14:52:10.787000"
    assert again.parts()["serve_saw"] == 0.0 and again.parts()["total"] == 94.4
    assert [k for k, v in again.parts().items() if v is None] == ["node_init"]  # Ray's tasks log no end
    # The first deploy started both engines together: their engine lines are paired by time.
    assert starts["msnf0pvy"].paired_by_time and starts["ylwnzw36"].paired_by_time


def test_the_node_cache_filled_in_the_replica_is_recognised_on_the_cpu() -> None:
    # 2026-12-06, this CPU (Ray 2.60): the node cache's fill in the replica, Ray's tasks skipped.
    starts = [
        s
        for s in replica_start.replica_starts(captured("2026-12-06/cpu-in-replica-fill"))
        if s.phase != "OpenAiIngress"
    ]
    assert {s.node_init_how for s in starts} == {"in the replica"}
    assert all(s.parts()["node_init"] is not None for s in starts)
    assert replica_start._IN_REPLICA == eks_pd_node_cache.IN_REPLICA_LINE


def test_the_9b_replica_start_on_the_gpu_with_the_fill_in_the_replica() -> None:
    # 2026-12-06, one H100, the image's stack, the 9B's full-weights checkpoint (17.5 GiB) on a warm
    # node: a decode replica Serve started again after its first start failed, Triton's cache warm.
    decode = by_replica(captured("2026-12-06/start-split/9b-decode-kill"))["yqi9k2sw"]
    assert decode.node_init_how == "in the replica"
    assert decode.parts() == {
        "serve_saw": None,  # started again after a failed start: no crash or version line
        "actor": 18.6,
        "node_init": 1.0,  # the node cache: `hash` and the manifest from S3, the sizes checked
        "engine_config": 19.7,  # Ray's engine-config task (a Ray worker importing vLLM)
        "engine_process": 17.3,
        "executor_worker": 20.0,
        "weights": 2.372846,  # 17.5 GiB from the page cache
        "engine_init": 3.68,
        "to_running": 5.7,
        "total": 88.3,
    }


def test_the_9b_decode_killed_and_changed_on_a_warm_node_split_from_their_faults() -> None:
    # 2026-12-06 (second lease), one H100, the 9B from the node cache, Triton's cache warm: a decode
    # replica killed (Serve saw the crash) and, in a run of its own, a decode setting changed
    # (Serve saw the new version). The same chain of four process starts in both.
    killed = by_replica(captured("2026-12-06/start-split/9b-decode-kill-full"))["b2o4ogcw"]
    changed = by_replica(captured("2026-12-06/start-split/9b-decode-update"))["en4rcw6g"]
    assert killed.parts() == {
        "serve_saw": 0.0, "actor": 19.5, "node_init": 1.1, "engine_config": 21.6, "engine_process": 17.9,
        "executor_worker": 20.0, "weights": 2.447593, "engine_init": 3.48, "to_running": 5.4, "total": 91.4,
    }  # fmt: skip
    assert changed.parts() == {
        "serve_saw": 0.1, "actor": 21.6, "node_init": 0.9, "engine_config": 18.5, "engine_process": 15.8,
        "executor_worker": 19.0, "weights": 2.188923, "engine_init": 3.3, "to_running": 5.7, "total": 87.1,
    }  # fmt: skip
    # The first prefill of the first run, Triton's cache empty: the engine init compiles (82.5 s).
    cold = by_replica(captured("2026-12-06/start-split/9b-decode-kill-full"))["5yg5lmso"]
    assert (cold.parts()["engine_init"], cold.parts()["total"]) == (82.49, 188.7)


def test_a_new_disks_start_from_the_shared_compile_caches_on_the_gpu() -> None:
    # 2026-12-06, one H200, the 9B from the node cache: the fresh machine's first prefill compiled
    # Triton's kernels and shared them; after the node's compile folders were removed, its successor
    # extracted them before its engine started, and its engine init compiled nothing.
    starts = by_replica(captured("2026-12-06/compile-share/9b-new-disk-h200"))
    first, successor = starts["yphi9fpw"], starts["zzrwj4b4"]
    assert str(first.compile_caches).startswith("compile caches: none shared at s3://")
    assert (first.parts()["engine_init"], first.parts()["total"]) == (85.91, 195.0)
    assert str(successor.compile_caches).startswith("compile caches: 849 files from s3://")
    assert successor.parts() == {
        "serve_saw": 0.0, "actor": 20.2,
        "node_init": 1.3,  # the weights' check and the archive's extraction (0.4 s), to its line
        "engine_config": 23.0, "engine_process": 19.4, "executor_worker": 23.0, "weights": 2.682964,
        "engine_init": 3.94, "to_running": 5.9, "total": 99.3,
    }  # fmt: skip
    assert successor.line().endswith("; compile caches: 849 files from s3://rehearsal-model-weights/compile/"
                                     "6f36e7550484b70a/fe7e2d093a64ecf8.tar.gz in 0.4 s")  # fmt: skip
    # The share after the engine started is not the start's: it does not move node_init's end.
    assert not str(first.compile_caches).startswith("compile caches: shared ")


def test_the_compile_caches_line_is_the_node_caches_own() -> None:
    """Every line the node cache writes of its compile caches starts as the split reads it."""
    source = Path(eks_pd_node_cache.__file__).read_text()
    written = [
        line.strip() for line in source.splitlines() if 'f"compile caches: ' in line or '"compile caches: ' in line
    ]
    assert len(written) >= 8
    assert all(f'"{replica_start._COMPILE_CACHES}' in line for line in written)


@pytest.mark.parametrize(
    ("drop", "missing"),
    [
        ("controller", None),  # without Serve's controller no start is found at all
        (
            "Initializing a V1 LLM engine",
            {"node_init", "engine_process", "executor_worker", "weights", "engine_init", "to_running"},
        ),
        (
            "Clearing the current platform cache",
            {"node_init", "engine_config", "engine_process", "executor_worker", "weights", "engine_init", "to_running"},
        ),
    ],
)
def test_a_missing_line_leaves_its_parts_unknown_not_guessed(drop: str, missing: set[str] | None) -> None:
    lines = [line for line in captured("2026-12-06/gpu-updates-both-phases") if drop not in line]
    starts = by_replica(lines)
    if missing is None:
        assert starts == {}
        return
    unknown = {k for k, v in starts["33zto5y6"].parts().items() if v is None}
    assert unknown == missing
