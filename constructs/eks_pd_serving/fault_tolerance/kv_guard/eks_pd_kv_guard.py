"""Decode's KV guard (pod-side): no answer from KV that never arrived.

vLLM 0.26-0.29 (the image's is 0.26.0) count a failed NIXL pull (``xfer_stats.record_failed_transfer``
in ``nixl/base_worker.py``) but, for a hybrid model, mark no block invalid ("TODO ... handle failed
transfer for HMA"), so neither ``kv_load_failure_policy`` engages: the request is decoded from KV
that was never written and answered with HTTP 200. A lost peer is never handshaken again, so every
later request is too. 0.30 reports the failed receive itself (recompute or fail), 0.32 re-handshakes.

Ray Serve LLM builds each replica's engine from ``RAYLLM_VLLM_ENGINE_CLS`` (Ray 2.58
``core/server/llm_server.py``); the GPU workers' env names this module's ``KvGuardEngine``, which
guards the engines that pull KV (decode) and stands aside in the others. Each engine step's
scheduler stats carry the worker's failed-transfer count, and vLLM's output loop hands them to
``OutputProcessor.update_scheduler_stats`` after that step's tokens and before the next step's: the
step that reports a failed pull is the one that hands the request back to the scheduler, so its
first token comes in a later step, after the guard has seen the count. From the first failed pull:

- every request that has not yielded its first chunk is refused with HTTP 503 (a retryable error;
  the first chunk is never sent), and so is every new one;
- the health check fails, so Serve stops the replica after three checks and starts a new one,
  whose engine handshakes with prefill afresh.

Requests already streaming had their KV before the failure and finish. ``EKS_PD_KV_GUARD``:
``auto`` guards where the engine's vLLM is older than 0.30 and stands aside where it reports failed
pulls itself (decided when the replica starts, from the vLLM it imports); ``on`` guards always
(the CPU rehearsal's way to test it on a newer vLLM). It imports nothing of the package.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

from ray.llm._internal.serve.core.configs.openai_api_models import ErrorInfo, ErrorResponse
from ray.llm._internal.serve.engines.vllm.vllm_engine import VLLMEngine

MODE_ENV = "EKS_PD_KV_GUARD"
MODES = ("auto", "on")
ENGINE_CLS = "eks_pd_kv_guard:KvGuardEngine"
# The engines that pull KV (decode); prefill's (kv_producer) and an engine without KV transfer
# (the rehearsals' colocated control) stand aside: the class is every GPU worker's.
PULLING_ROLES = ("kv_consumer", "kv_both")
# The first vLLM whose NIXL connector reports a failed pull for hybrid models itself.
REPORTS_FAILED_PULLS = (0, 30)
# The lines an operator (and the rehearsals) look for.
ON_LINE = "KV guard on"
ASIDE_LINE = "KV guard stands aside"
TRIPPED_LINE = "KV guard tripped"
REFUSAL = (
    "decode could not pull this request's KV cache from prefill; nothing was generated. "
    "Retry: the decode replica is being replaced."
)

# Serve's logger: in the replica's log file, and in the pod's log (Serve logs to stderr there).
logger = logging.getLogger("ray.serve")


def reports_failed_pulls(version: str) -> bool:
    """Whether this vLLM handles a failed NIXL pull itself; an unreadable version does not."""
    parts = version.split("+", 1)[0].split(".")
    try:
        return (int(parts[0]), int(parts[1])) >= REPORTS_FAILED_PULLS
    except (IndexError, ValueError):
        return False


def kv_role(vllm_config: Any) -> str | None:
    """The engine's KV role (its kv_transfer_config's), None without KV transfer."""
    return getattr(getattr(vllm_config, "kv_transfer_config", None), "kv_role", None)


def failed_pulls(scheduler_stats: Any) -> int:
    """Failed NIXL transfers in one step's scheduler stats (vLLM sends the connector's stats as
    the dict ``NixlKVConnectorStats.data``: one entry per failure)."""
    stats = getattr(scheduler_stats, "kv_connector_stats", None)
    data = getattr(stats, "data", stats)
    if not isinstance(data, dict):
        return 0
    return len(data.get("num_failed_transfers") or ())


class Tripwire:
    """Set once, by the engine's output loop, at the first failed pull; never reset: the replica
    that saw it is replaced."""

    def __init__(self) -> None:
        self.failed = 0
        self.at: float | None = None
        self.event = asyncio.Event()

    @property
    def tripped(self) -> bool:
        return self.at is not None

    def count(self, failed: int) -> None:
        if failed <= 0:
            return
        self.failed += failed
        if self.at is None:
            self.at = time.time()
            self.event.set()
            logger.error(
                "%s: %d KV pull(s) from prefill failed; refusing requests without a first token "
                "(HTTP 503) and failing health checks until Serve replaces this replica",
                TRIPPED_LINE,
                failed,
            )

    def refusal(self) -> ErrorResponse:
        return ErrorResponse(error=ErrorInfo(message=REFUSAL, type="ServiceUnavailable", code=503))


def attach(client: Any, version: str, mode: str) -> Tripwire | None:
    """Watch ``client`` (vLLM's AsyncLLM) for failed pulls; None where the guard stands aside.
    Raises where it should guard but cannot see the count: a guard that cannot fail closed would
    let wrong answers through."""
    if mode not in MODES:
        raise RuntimeError(f"{MODE_ENV}={mode!r}: not a mode. Fix: one of {', '.join(MODES)}")
    role = kv_role(getattr(client, "vllm_config", None))
    if role not in PULLING_ROLES:
        logger.info("%s: this engine pulls no KV (kv_role %s)", ASIDE_LINE, role)
        return None
    if mode == "auto" and reports_failed_pulls(version):
        logger.info("%s: vLLM %s reports failed KV pulls itself", ASIDE_LINE, version)
        return None
    processor: Any = getattr(client, "output_processor", None)
    found: Callable[[Any], None] | None = getattr(processor, "update_scheduler_stats", None)
    if not getattr(client, "log_stats", False) or found is None:
        raise RuntimeError(
            f"KV guard: vLLM {version} gives it no scheduler stats (engine stats off, or vLLM "
            f"changed its output loop), so it cannot see a failed KV pull. Fix: leave "
            "disable_log_stats off, or deploy with kv_pull_guard=off and an image whose vLLM is 0.30 or newer"
        )
    update = found
    wire = Tripwire()

    def observe(scheduler_stats: Any) -> None:
        update(scheduler_stats)
        wire.count(failed_pulls(scheduler_stats))

    processor.update_scheduler_stats = observe
    logger.info("%s: vLLM %s (%s)", ON_LINE, version, mode)
    return wire


async def guarded(wire: Tripwire | None, chunks: AsyncGenerator[Any, None]) -> AsyncGenerator[Any, None]:
    """``chunks`` (one request's), refused while or after the wire trips before the first of them."""
    if wire is None:
        async for chunk in chunks:
            yield chunk
        return
    if wire.tripped:
        await chunks.aclose()
        yield wire.refusal()
        return
    first = asyncio.ensure_future(chunks.__anext__())
    tripped = asyncio.ensure_future(wire.event.wait())
    try:
        await asyncio.wait({first, tripped}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # the client went away: so does the request
        await _cancel(first)
        raise
    finally:
        tripped.cancel()
    if wire.tripped:
        # Cancelling the engine's generate() aborts the request in the engine; a first chunk that
        # came with the trip is dropped (it may come from the KV that failed).
        await _cancel(first)
        await chunks.aclose()
        yield wire.refusal()
        return
    try:
        chunk = first.result()
    except StopAsyncIteration:
        return
    yield chunk
    async for chunk in chunks:
        yield chunk


async def _cancel(task: asyncio.Future[Any]) -> None:
    task.cancel()
    with contextlib.suppress(BaseException):
        await task


class KvGuardEngine(VLLMEngine):  # type: ignore[misc]
    """Ray Serve LLM's vLLM engine with the guard on its AsyncLLM."""

    _kv_guard: Tripwire | None = None

    def _start_async_llm_engine(self, *args: Any, **kwargs: Any) -> Any:
        import vllm

        client = super()._start_async_llm_engine(*args, **kwargs)
        self._kv_guard = attach(client, vllm.__version__, os.environ.get(MODE_ENV, "auto"))
        return client

    async def chat(self, request: Any, raw_request_info: Any = None) -> AsyncGenerator[Any, None]:
        async for chunk in guarded(self._kv_guard, super().chat(request, raw_request_info)):
            yield chunk

    async def completions(self, request: Any, raw_request_info: Any = None) -> AsyncGenerator[Any, None]:
        async for chunk in guarded(self._kv_guard, super().completions(request, raw_request_info)):
            yield chunk

    async def check_health(self) -> None:
        wire = self._kv_guard
        if wire is not None and wire.tripped:
            raise RuntimeError(
                f"{TRIPPED_LINE} {time.time() - (wire.at or 0):.0f} s ago after {wire.failed} failed KV "
                "pull(s): this engine cannot pull from prefill again; Serve replaces the replica"
            )
        await super().check_health()
