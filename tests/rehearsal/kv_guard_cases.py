"""The KV guard's cases against the real classes it meets in a decode replica (vLLM's
OutputProcessor, SchedulerStats and NIXL connector stats; Ray Serve LLM's ErrorResponse), run by
tests/rehearsal/test_kv_guard.py in the rehearsal's virtualenv: prints ``ok <case>`` for each."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "constructs/eks_pd_serving/fault_tolerance/kv_guard"))

import eks_pd_kv_guard as guard
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import NixlKVConnectorStats
from vllm.v1.engine.output_processor import OutputProcessor
from vllm.v1.metrics.stats import SchedulerStats


def step_stats(failed: int) -> SchedulerStats:
    """One engine step's stats as the scheduler sends them (the connector's data dict)."""
    nixl = NixlKVConnectorStats()
    for _ in range(failed):
        nixl.record_failed_transfer()
    return SchedulerStats(kv_connector_stats=nixl.data)


def client(log_stats: bool = True, role: str | None = "kv_consumer") -> Any:
    # AsyncLLM's three attributes the guard reads; the processor and the KV config are vLLM's own.
    kv = KVTransferConfig(kv_connector="NixlConnector", kv_role=role) if role else None
    return SimpleNamespace(
        output_processor=OutputProcessor(None, log_stats=log_stats),
        log_stats=log_stats,
        vllm_config=SimpleNamespace(kv_transfer_config=kv),
    )


class Source:
    """One request's chunks as the engine would yield them: ``gate`` holds back the first."""

    def __init__(self, chunks: list[str], gate: asyncio.Event | None = None) -> None:
        self.chunks, self.gate, self.started, self.closed = chunks, gate, False, False

    async def __call__(self) -> Any:
        self.started = True
        try:
            for index, chunk in enumerate(self.chunks):
                if index == 0 and self.gate is not None:
                    await self.gate.wait()
                yield chunk
        finally:
            self.closed = True


async def collect(wire: Any, source: Source) -> list[Any]:
    return [chunk async for chunk in guard.guarded(wire, source())]


def refused(chunks: list[Any]) -> bool:
    return len(chunks) == 1 and getattr(chunks[0], "error", None) is not None and chunks[0].error.code == 503


async def main() -> None:
    assert not guard.reports_failed_pulls("0.26.0") and not guard.reports_failed_pulls("0.29.1+cu130")
    assert guard.reports_failed_pulls("0.30.0") and guard.reports_failed_pulls("0.32.0")
    assert not guard.reports_failed_pulls("unknown")
    assert guard.failed_pulls(step_stats(2)) == 2 and guard.failed_pulls(step_stats(0)) == 0
    assert guard.failed_pulls(SchedulerStats()) == 0 and guard.failed_pulls(None) == 0
    print("ok failed pulls read from vLLM's own stats")

    assert guard.attach(client(), "0.32.0", "auto") is None
    assert guard.attach(client(role="kv_producer"), "0.26.0", "on") is None  # prefill pulls nothing
    assert guard.attach(client(role=None), "0.26.0", "on") is None  # no KV transfer (the control)
    for version, mode in (("0.26.0", "auto"), ("0.32.0", "on")):
        engine = client()
        wire = guard.attach(engine, version, mode)
        assert wire is not None and not wire.tripped
        engine.output_processor.update_scheduler_stats(step_stats(0))
        engine.output_processor.update_scheduler_stats(None)
        assert not wire.tripped
        engine.output_processor.update_scheduler_stats(step_stats(1))
        assert wire.tripped and wire.failed == 1
    print(
        "ok auto stands aside on 0.32, guards 0.26; on guards 0.32; prefill and no-KV engines stand aside; "
        "trips at the first failed pull"
    )

    for engine, mode in ((client(log_stats=False), "auto"), (client(), "sometimes")):
        try:
            guard.attach(engine, "0.26.0", mode)
        except RuntimeError as error:
            assert "Fix:" in str(error)
        else:
            raise AssertionError(f"attached blind ({mode})")
    print("ok refuses to start blind (stats off) or with an unknown mode")

    # A request waiting for its first token when the wire trips: refused at once, its source closed.
    engine = client()
    wire = guard.attach(engine, "0.26.0", "auto")
    waiting, streaming = Source(["from unwritten KV", "more"], asyncio.Event()), Source(["a", "b", "c"])
    streaming_gen = guard.guarded(wire, streaming())
    first = await streaming_gen.__anext__()
    pending = asyncio.ensure_future(collect(wire, waiting))
    await asyncio.sleep(0.05)
    started = time.monotonic()
    engine.output_processor.update_scheduler_stats(step_stats(1))
    chunks = await asyncio.wait_for(pending, 2)
    assert refused(chunks) and waiting.closed and time.monotonic() - started < 1
    # The request that had its first token before the trip finishes.
    assert [first, *[c async for c in streaming_gen]] == ["a", "b", "c"]
    # After the trip, a new request is refused without reaching the engine.
    later = Source(["x"])
    assert refused(await collect(wire, later)) and not later.started
    print("ok waiting request refused within 1 s of the trip; streaming one finishes; new ones refused unstarted")

    # A first chunk that arrives together with the trip is dropped, never sent.
    engine = client()
    wire = guard.attach(engine, "0.26.0", "auto")
    gate = asyncio.Event()
    racing = Source(["from unwritten KV"], gate)
    pending = asyncio.ensure_future(collect(wire, racing))
    await asyncio.sleep(0.05)
    gate.set()
    engine.output_processor.update_scheduler_stats(step_stats(1))
    assert refused(await pending)
    print("ok a first chunk arriving with the trip is dropped")

    # The control: without the guard the same chunk goes out (what vLLM 0.26 answers with).
    engine = client()
    racing = Source(["from unwritten KV"], asyncio.Event())
    racing.gate.set()  # type: ignore[union-attr]
    assert await collect(None, racing) == ["from unwritten KV"]
    print("ok control: without the guard the chunk is sent")


if __name__ == "__main__":
    asyncio.run(main())
