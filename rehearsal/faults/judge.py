"""The verdict on a run's events: per fault, the requests it could touch and how each ended, the
recovery time, the completed answers that are wrong (``judge``); then what must hold of the whole
run (``holds``, ``failover_holds``), each fault's own checks asked of its unit in the registry."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any

from ..probes import counted_since
from .load import CONTROL_OUTCOME, Outcome, serving_again
from .registry import fault_key, key_of, unit_of


def near_tie(answer: list[list[Any]], reference: list[list[Any]]) -> float | None:
    """Where ``answer`` first leaves ``reference`` token by token: the logprob gap between its
    token and the reference's there, when each is in the other's top ``TOP_LOGPROBS``; None when
    they are not (or one has no logprobs, or they never differ)."""
    for (mine, my_top), (theirs, their_top) in zip(answer, reference, strict=False):
        if mine != theirs:
            return float(my_top[mine] - my_top[theirs]) if mine in their_top and theirs in my_top else None
    return None


def judge(events: list[dict[str, Any]], bound_s: float) -> list[dict[str, Any]]:
    """Per fault: the requests it could touch (in flight at it, or started before recovery and
    the hold), how they ended, the recovery time, and the completed answers that are wrong.

    An answer has two right forms: the colocated control's (the prompt computed where it is
    decoded, as decode does when it recomputes a failed pull) and the PD app's own before any
    fault (the KV computed by prefill and moved). Greedy, each is one text a prompt; the two
    can differ in the last tokens (prefill's and decode's numerics on random weights). Greedy
    decoding is not batch-invariant either, so an answer that leaves every right text is still
    right where it leaves one of them at a near tie (``near_tie``); it is wrong when it is neither."""
    answers = next(e for e in events if e["type"] == "expected")
    control, pd = answers["control"], answers["pd"]
    # Each prompt's right texts: the control's and the PD app's, and (``--control-load-s``) every
    # text the colocated control gave under the clients' load with no fault (on random weights a
    # near tie can flip a late token with the batch: GPU, 2026-12-05).
    right = {p: {control[p], pd[p], *(answers.get("control_under_load") or {}).get(p, [])} for p in pd}
    # The right texts' tokens and top logprobs (runs from the logprobs on; older events have none).
    references = answers.get("reference_tokens") or {}
    outcomes = [Outcome.of(e) for e in events if e["type"] == "outcome"]
    faults = [e for e in events if e["type"] == "fault"]
    results = []
    for index, fault in enumerate(faults):
        until = faults[index + 1]["at"] if index + 1 < len(faults) else float("inf")
        # The KV link's fault starts when the link is cut (its counters are read just before).
        cut = [
            e["at"] for e in events if e["type"] == "kv_link" and e["event"] == "cut" and fault["at"] <= e["at"] < until
        ]
        at = cut[0] if cut else fault["at"]
        # Its requests: those that ended from the fault on, before the next fault (a request still
        # in flight at the next one is that fault's: it is cut, or held, by that one).
        window = [o for o in outcomes if o.ended >= at and o.started < until and o.ended <= until]
        serving = serving_again(window, at)
        recovered_s = serving - at if serving is not None and serving - at <= bound_s + 5 else None
        affected = [o for o in window if o.started <= at + (recovered_s or bound_s) + fault["hold_s"]]
        completed = [o for o in window if o.complete]
        # The answers that are no right text: the gap at the near tie where each left one, or None.
        other = [o for o in completed if o.text not in right[o.prompt]]
        gaps = [min((g for r in references.get(o.prompt, []) if (g := near_tie(o.tokens, r)) is not None), default=None)
                for o in other]  # fmt: skip
        restarted = next((e["at"] for e in events if e["type"] == "gcs_restarted" and at <= e["at"] < until), None)
        down = [o for o in window if restarted is not None and at < o.started <= restarted]
        results.append(
            {
                "fault": fault["name"],
                "key": fault.get("key") or fault_key(fault["name"]),
                "killed": fault["killed"],
                "requests_affected": len(affected),
                "requests_failed": sum(not o.complete for o in affected),
                "failures": dict(Counter(o.kind for o in affected if not o.complete)),
                "recovered_s": recovered_s,
                "held_s": fault["hold_s"],
                "first_failure_s": min((o.ended - at for o in affected if not o.complete), default=None),
                # The longest any request of the fault's window took (held, not failed, counts too).
                "slowest_s": max((o.ended - o.started for o in window), default=None),
                # The update fault: how long Serve took to bring the new config to RUNNING.
                "redeploy_s": next(
                    (
                        round(e["ready_s"], 1)
                        for e in events
                        if e["type"] == "redeployed" and at <= e.get("at", at) < until
                    ),
                    None,
                ),
                # The bounds a client meets: how long after the fault the requests in flight at it
                # ended, and the longest a failed request took from its start to its end.
                "in_flight_ended_s": max((o.ended - at for o in window if o.started <= at), default=None),
                "in_flight_at_fault": sum(o.started <= at for o in window),
                "longest_failed_s": max((o.ended - o.started for o in affected if not o.complete), default=None),
                "completed": len(completed),
                "wrong_answers": sum(g is None for g in gaps),
                "near_tie_answers": sum(g is not None for g in gaps),
                "near_tie_gap_max": max((round(g, 4) for g in gaps if g is not None), default=None),
                "answers_without_logprobs": sum(not o.tokens for o in completed),
                "answered_as_control": sum(o.text == control[o.prompt] != pd[o.prompt] for o in completed),
                "ended_by_fault": not any(e["type"] == "fault_end" and e["name"] == fault["name"] for e in events),
                # A GCS restarted from its store: how long it was down, the answers finished while it
                # was (in flight at the kill or started after it), and those started while it was.
                "gcs_down_s": None if restarted is None else round(restarted - at, 1),
                "completed_while_gcs_down": None
                if restarted is None
                else sum(o.complete and at < o.ended <= restarted for o in window),
                "started_while_gcs_down": None if restarted is None else [sum(o.complete for o in down), len(down)],
                # What a fault's own probes saw (its requests beside the clients' load).
                "probes": [e for e in events if e["type"] == "probe" and e.get("key") == fault.get("key")],
                **_kv_link_figures(events, at, until),
                **_path_figures(events, fault, until),
            }
        )
    return results


def control_texts(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]] | None:
    """The colocated control under load: each prompt's complete answers and how many gave each
    text (most first); None when the run served it no load."""
    answers = [Outcome.of(e) for e in events if e["type"] == CONTROL_OUTCOME]
    if not answers:
        return None
    found: dict[str, Counter[str]] = {}
    for answer in (a for a in answers if a.complete):
        found.setdefault(answer.prompt, Counter())[answer.text] += 1
    return {p: {"answers": sum(c.values()), "by_text": dict(c.most_common())} for p, c in sorted(found.items())}


def _path_figures(events: list[dict[str, Any]], fault: dict[str, Any], until: float) -> dict[str, Any]:
    """With the failover: requests by the path that served them from the fault to its end, and how
    long after the fault the pair served disaggregated again; {} without it."""
    start = fault.get("paths")
    if not start:
        return {}
    end = next((e for e in events if e["type"] == "fault_end" and e["name"] == fault["name"]), None)
    again = next((e for e in events if e["type"] == "disaggregated_again" and fault["at"] <= e["at"] < until), None)
    stop = (end or {}).get("paths") or {}
    return {
        "served_by_path": {
            path: stop[path] - start.get(path, 0.0) for path in sorted(stop) if stop[path] - start.get(path, 0.0)
        },
        "disaggregated_again_s": None if again is None else round(again["after_s"], 1),
    }


def _kv_link_figures(events: list[dict[str, Any]], at: float, until: float) -> dict[str, Any]:
    """For the KV link's cut: the engines' NIXL counters over the cut and after the heal (pulls
    that failed, pulls that moved KV once the link was back), from the events; {} otherwise."""
    link = {e["event"]: e for e in events if e["type"] == "kv_link" and at <= e["at"] < until}
    if "cut" not in link:
        return {}
    cut, healed, end = (link.get(k, {}).get("counters") for k in ("cut", "healed", "end"))

    def by_replica(reading: dict[str, Any]) -> dict[str, dict[str, float]]:
        # Runs recorded before 2026-12-03 summed every replica into one reading.
        return {"": reading} if all(isinstance(v, (int, float)) for v in reading.values()) else reading

    def moved(key: str, start: dict[str, Any] | None, stop: dict[str, Any] | None) -> float | None:
        return None if start is None or stop is None else counted_since(key, by_replica(start), by_replica(stop))

    return {
        "kv_connections_cut": link["cut"]["connections"],
        "kv_cut_s": round(link["healed"]["at"] - link["cut"]["at"], 1) if "healed" in link else None,
        "kv_failed_transfers_while_cut": moved("nixl_failed_transfers", cut, healed),
        "kv_failed_transfers_after_heal": moved("nixl_failed_transfers", healed, end),
        "kv_transfers_while_cut": moved("nixl_transfers", cut, healed),
        "kv_transfers_after_heal": moved("nixl_transfers", healed, end),
        "kv_external_tokens_after_heal": moved("external_kv_tokens", healed, end),
        # Engine replicas exporting at the end that were not at the cut: Serve replaced them.
        "kv_replicas_new_at_end": sorted(set(by_replica(end or {})) - set(by_replica(cut or {}))),
    }


def answers_judged(fault: dict[str, Any]) -> str:
    """A fault's line's end: its wrong answers, and those that left a right text at a near tie."""
    line = f"{fault['wrong_answers']} of {fault['completed']} completed answers wrong"
    count = fault.get("near_tie_answers")
    return (
        f"{line}, {count} more left a right text at a near tie (gap at most {fault['near_tie_gap_max']})"
        if count
        else line
    )


def read_events(path: Path, setting: str) -> list[dict[str, Any]]:
    """A run's events; a file that is missing, unreadable or holds no answers to judge by is one
    line naming the setting."""
    try:
        with gzip.open(path, "rt") if path.suffix == ".gz" else path.open() as lines:
            events = [json.loads(line) for line in lines if line.strip()]
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"{setting} {path}: cannot read it ({type(exc).__name__}); name a run's .events.jsonl(.gz)"
        ) from None
    if not any(e.get("type") == "expected" for e in events):
        raise ValueError(f"{setting} {path}: no answers recorded (the run ended before its first fault)")
    return events


def holds(report: dict[str, Any]) -> bool:
    """What must hold of every run: each chosen fault was injected (one judged fault per change of
    the update), no completed answer is wrong, each bounded fault served again within the bound; then
    each fault's own checks (``Fault.holds``) and, with the PD pair's failover, ``failover_holds``."""
    faults = report["faults"]
    units = [(f, unit_of(key_of(f))) for f in faults]
    injected = sum(len(u.judged_keys(report)) for u in (unit_of(k) for k in report["faults_chosen"]) if u)
    ok = len(faults) == injected and all(f["recovered_s"] is not None for f, u in units if u and u.bounded)
    ok = ok and all(f["wrong_answers"] == 0 for f in faults)
    ok = ok and all(u.holds(f, report) for f, u in units if u)
    return ok and (not report.get("failover") or failover_holds(report))


def failover_holds(report: dict[str, Any]) -> bool:
    """With the PD pair's failover, each fault's ``Fault.failover_holds`` at the failover's replica
    wait: a replica kill or a KV cut fails no more than it may (a decode kill the streams in flight)
    and served disaggregated again; an update fails no request."""
    wait_s = float(report["failover"]["wait_s"])
    return all(u.failover_holds(f, wait_s) for f in report["faults"] if (u := unit_of(key_of(f))))
