"""A request whose dispatch ends in decode's engine dying, as a request that crashes vLLM would:
decode's engine core is killed and one marked request is sent at once, then the same body again.
Neither may reach prefill (a request that killed one engine would kill the other), and the clients'
own requests must be served meanwhile by the engine still standing."""

from __future__ import annotations

import contextlib
import signal
import time
import uuid
from typing import Any

import psutil

from eks_pd_serving.fault_tolerance import failover
from eks_pd_serving.k8s import serve_config as layout
from eks_pd_serving.phase import Phase

from ..probes import _chat_body
from ..processes import marked_processes
from .fault import Context, Fault, served_through_failover

# vLLM names its engine core process so (``VLLM::EngineCore``, spawned by the replica's process).
ENGINE_CORE = "EngineCore"


class PoisonedRequest(Fault):
    key = "poison"
    injects = (
        "decode's engine core killed, then one marked request at once (its dispatch ends in the engine's "
        "death), then its body again"
    )
    heals = "Serve replaces the decode replica"
    shows = (
        "the marked request and its retry get HTTP 503 (PdEngineDied) and never reach prefill; the clients' "
        "requests are served whole by prefill meanwhile (at most those in flight at the death fail); the pair "
        "serves disaggregated again"
    )
    titles = (("decode engine killed by a request", "poison"),)

    def run(self, context: Context) -> None:
        title = layout.replica_title(context.rehearsed, Phase.DECODE)
        body = _chat_body(context.endpoint, f"A request that kills its engine {uuid.uuid4().hex}", max_tokens=8)
        seen: dict[str, Any] = {}

        def inject() -> list[int]:
            cores = [
                child
                for replica in marked_processes(context.run_id, title)
                for child in replica.children(recursive=True)
                if ENGINE_CORE in " ".join(child.cmdline()) or ENGINE_CORE in child.name()
            ]
            for core in cores:
                with contextlib.suppress(psutil.Error):
                    core.send_signal(signal.SIGKILL)
            with context.endpoint.client(60) as client:
                for attempt in ("marked", "again"):
                    started = time.time()
                    answer = client.post("/v1/chat/completions", json=body)
                    error = answer.json().get("error") or {} if answer.status_code != 200 else {}
                    seen[attempt] = {
                        "status": answer.status_code,
                        "type": error.get("type"),
                        "took_s": time.time() - started,
                    }
            return [core.pid for core in cores]

        context.inject(self.key, "decode engine killed by a request", inject)
        context.events.write({"type": "probe", "key": self.key, "at": time.time(), "seen": seen})

    def holds(self, judged: dict[str, Any], report: dict[str, Any]) -> bool:
        """The marked request and its retry: 503 of the dead engine's own, not replayed."""
        seen = (judged.get("probes") or [{}])[0].get("seen", {})
        return bool(seen) and all(s["status"] == 503 and s["type"] == failover.poisoned_type() for s in seen.values())

    def failover_holds(self, judged: dict[str, Any], wait_s: float) -> bool:
        # The marked request and its retry are the fault's own, not the clients': of theirs, at most
        # those in flight at the death fail.
        return served_through_failover(judged, wait_s, judged["in_flight_at_fault"])


FAULT = PoisonedRequest()
