"""The KV link between the engines cut for ``KV_CUT_S``, both engines alive, then healed.

NIXL runs over UCX on TCP for the run, in a port range of its own, and a packet filter resets
every connection in that range (root and iptables), so decode's pulls fail as they would when the
network between the phases breaks; the healed link must carry KV again."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import threading
import time
from typing import Any

import psutil

from ..probes import engine_counters_by_replica
from ..processes import marked_processes
from .fault import Context, Fault, RunArgs, served_through_failover

# On one host UCX reads a peer's memory through shared memory (cma), which no packet filter sees:
# this run's NIXL takes TCP on loopback, its listeners in a range of their own (below Linux's
# ephemeral ports, above Ray's worker ports), so cutting that range cuts KV and nothing else.
KV_PORTS = (23000, 23999)
KV_UCX_ENV = {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo", "UCX_TCP_PORT_RANGE": "{}-{}".format(*KV_PORTS)}
KV_CUT_S = 10.0


class KvLink:
    """Loopback TCP in ``KV_PORTS``, through a chain of this run's own: ``cut()`` resets every
    connection there (both directions), ``heal()`` lets it through again, ``remove()`` leaves the
    host's filter as it was (also called by the parent, whatever became of the child)."""

    def __init__(self, chain: str) -> None:
        self.chain = chain

    @staticmethod
    def _iptables(*args: str, check: bool = True) -> bool:
        ran = subprocess.run(["iptables", "-w", *args], capture_output=True, text=True, check=False)
        if check and ran.returncode != 0:
            raise RuntimeError(f"iptables {' '.join(args)}: {ran.stderr.strip()}")
        return ran.returncode == 0

    @classmethod
    def preflight(cls) -> None:
        if shutil.which("iptables") is None:
            raise RuntimeError("iptables not found. Fix: apt-get install iptables (make rehearse-faults does)")
        if not cls._iptables("-S", "INPUT", check=False):
            raise RuntimeError("iptables cannot read the filter table. Fix: run the KV fault as root (CAP_NET_ADMIN)"
                               " or leave it out with --faults decode,prefill,gcs")  # fmt: skip

    def install(self) -> None:
        self.remove()
        self._iptables("-N", self.chain)
        self._iptables("-I", "INPUT", "-i", "lo", "-j", self.chain)

    def cut(self) -> None:
        ports = "{}:{}".format(*KV_PORTS)
        # The resets themselves pass (from a port in the range too): else they are rejected in
        # turn, never arrive, and the connections hang like a silent drop instead of failing.
        self._iptables("-A", self.chain, "-p", "tcp", "--tcp-flags", "RST", "RST", "-j", "RETURN")
        for direction in ("--dport", "--sport"):
            rule = ["-p", "tcp", direction, ports, "-j", "REJECT", "--reject-with", "tcp-reset"]
            self._iptables("-A", self.chain, *rule)

    def heal(self) -> None:
        self._iptables("-F", self.chain)

    def remove(self) -> None:
        while self._iptables("-D", "INPUT", "-i", "lo", "-j", self.chain, check=False):
            pass
        self._iptables("-F", self.chain, check=False)
        self._iptables("-X", self.chain, check=False)


def _kv_connections(run_id: str) -> int:
    """The run's TCP connections with an end in ``KV_PORTS``: NIXL's, if UCX took TCP."""
    low, high = KV_PORTS
    found = set()
    for process in marked_processes(run_id):
        with contextlib.suppress(psutil.Error):
            for connection in process.net_connections("tcp"):
                ends = [connection.laddr, connection.raddr]
                if connection.status == psutil.CONN_ESTABLISHED and any(e and low <= e.port <= high for e in ends):
                    found.add((connection.laddr, connection.raddr))
    return len(found)


def _cut(link: KvLink, context: Context) -> list[int]:
    """Cut the KV link now and heal it ``KV_CUT_S`` later (a timer: the load goes on meanwhile);
    the engines' NIXL counters at the cut and at the heal go to the events."""
    connections = _kv_connections(context.run_id)
    if not connections:
        raise RuntimeError(f"no connection in {KV_PORTS} before the cut: NIXL did not take UCX over TCP")
    metrics = context.endpoint.metrics_url
    before = engine_counters_by_replica(metrics)  # read first: a scrape takes seconds here
    link.cut()
    context.events.write({"type": "kv_link", "event": "cut", "at": time.time(), "connections": connections,
                          "counters": before})  # fmt: skip

    def heal() -> None:
        link.heal()
        at = time.time()
        context.events.write({"type": "kv_link", "event": "healed", "at": at,
                              "counters": engine_counters_by_replica(metrics)})  # fmt: skip

    threading.Timer(KV_CUT_S, heal).start()
    return []


class KvLinkCut(Fault):
    key = "kv"
    injects = f"every connection of NIXL's UCX-over-TCP port range reset for {KV_CUT_S:g} s (iptables, root)"
    heals = "the packet filter lets the link through again; decode's next pulls must move KV"
    shows = (
        "pulls (or requests) failed while cut, KV moved again after the heal; with the KV guard, it tripped "
        "and Serve replaced decode; without it, the engines logged their failed pulls and under `recompute` "
        "no request failed; with the failover, no request fails"
    )
    titles = (("KV link", "kv"),)

    def preflight(self) -> None:
        KvLink.preflight()

    def engine_env(self) -> dict[str, str]:
        return dict(KV_UCX_ENV)

    def run(self, context: Context) -> None:
        link = KvLink(context.run.kv_chain)
        link.install()
        # Held past the heal: the link must carry KV again, not only decode recompute.
        context.inject(self.key, "KV link cut", lambda: _cut(link, context), hold_s=KV_CUT_S + 20.0,
                       settle_s=KV_CUT_S)  # fmt: skip
        context.events.write({"type": "kv_link", "event": "end", "at": time.time(),
                              "counters": engine_counters_by_replica(context.endpoint.metrics_url)})  # fmt: skip
        link.remove()

    def cleanup(self, run: RunArgs) -> None:
        KvLink(run.kv_chain).remove()

    def holds(self, judged: dict[str, Any], report: dict[str, Any]) -> bool:
        pulls_failed = (judged["kv_failed_transfers_while_cut"] or 0) > 0
        # The cut reached the KV path: pulls failed, or (an engine that died of it) requests did.
        ok = (pulls_failed or judged["requests_failed"] > 0) and (judged["kv_transfers_after_heal"] or 0) > 0
        guard = report.get("kv_guard") or {}
        if guard.get("on"):
            # A guarded decode trips at the first failed pull it counts, and whatever failed, Serve
            # replaced the decode replica (the new one pulled KV after the heal).
            ok = ok and (not pulls_failed or guard["tripped"] > 0)
            return ok and (judged["requests_failed"] == 0 or bool(judged["kv_replicas_new_at_end"]))
        ok = ok and report["kv_pull_failed_lines"] > 0  # the engine logged its failed pulls
        return ok and (report["kv_load_failure_policy"] != "recompute" or judged["requests_failed"] == 0)

    def failover_holds(self, judged: dict[str, Any], wait_s: float) -> bool:
        return served_through_failover(judged, wait_s, allowed=0)


FAULT = KvLinkCut()
