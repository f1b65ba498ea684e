"""A replica's process killed: decode's mid-stream, prefill's while requests are in flight (one
fault, two phases)."""

from __future__ import annotations

from typing import Any

from eks_pd_serving.k8s import serve_config as layout
from eks_pd_serving.phase import Phase

from .fault import Context, Fault, kill, served_through_failover


class ReplicaKilled(Fault):
    def __init__(self, phase: str, when: str, in_flight_may_fail: bool) -> None:
        self.key = phase
        self.injects = f"SIGKILL to the {phase} replica's process {when}"
        self.heals = f"Serve starts a new {phase} replica"
        # Under the failover a started decode stream cannot move, and a request in flight at a dying
        # engine is not replayed (it may have killed it: ``Poisoned``), so those in flight at either
        # kill may fail; nothing else does (the other engine serves alone meanwhile).
        fails = "at most the requests in flight at it fail" if in_flight_may_fail else "no request fails"
        self.shows = (
            f"serves again within the bound; with the failover, {fails} and the pair serves disaggregated again"
        )
        self.titles = ((f"{phase} replica", phase),)
        self.in_flight_may_fail = in_flight_may_fail

    def run(self, context: Context) -> None:
        title = layout.replica_title(context.rehearsed, Phase(self.key))
        context.inject(self.key, f"{self.key} replica killed", lambda: kill(context.run_id, title))

    def failover_holds(self, judged: dict[str, Any], wait_s: float) -> bool:
        allowed = judged["in_flight_at_fault"] if self.in_flight_may_fail else 0
        return served_through_failover(judged, wait_s, allowed)


DECODE = ReplicaKilled("decode", "while streams are in flight", in_flight_may_fail=True)
PREFILL = ReplicaKilled("prefill", "while requests are in flight", in_flight_may_fail=True)
