"""The fault rehearsal's judgement (rehearsal/faults/judge.py and each fault's own checks) on
recorded events: which requests a fault touched, how each ended as a client saw it, the recovery
time, wrong answers. The faults themselves run in `make rehearse-faults` (docs/features/failures.md
has a run's table)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from rehearsal.faults.cli import main
from rehearsal.faults.judge import holds, judge, near_tie
from rehearsal.faults.load import CONTROL_OUTCOME, Outcome
from rehearsal.faults.registry import fault_key
from rehearsal.faults.replace import REPLACED
from rehearsal.faults.update import UPDATES

ROOT = Path(__file__).resolve().parents[2]

RIGHT = "the answer"
LOCAL = "the answer, computed where it is decoded"  # the colocated control's, when it differs


def outcome(started: float, ended: float, **kind: Any) -> dict[str, Any]:
    fields = {"status": 200, "error": None, "text": RIGHT, "finish_reason": "length", "done": True, **kind}
    return {"type": "outcome", **asdict(Outcome("p", started, ended, **fields))}


def events(
    *outcomes: dict[str, Any], hold_s: float = 0.0, ended: bool = True, control: str = RIGHT
) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = [
        {"type": "expected", "control": {"p": control}, "pd": {"p": RIGHT}, "kv_load_failure_policy": "recompute"},
        {"type": "fault", "name": "f", "at": 10.0, "killed": [1], "hold_s": hold_s},
    ]
    found += outcomes
    if ended:
        found.append({"type": "fault_end", "name": "f", "at": 99.0})
    return found


def test_a_cut_stream_is_a_failure_and_recovery_is_the_second_request_after_the_fault() -> None:
    (result,) = judge(
        events(
            outcome(9.0, 11.0, text="the", finish_reason=None, done=False),  # in flight at the fault
            outcome(11.5, 60.0),  # waited for the new replica
            outcome(12.0, 61.0),
            outcome(61.0, 62.0),
        ),
        bound_s=240,
    )
    assert result["requests_failed"] == 1
    assert result["failures"] == {"stream cut after 3 characters (HTTP 200, no [DONE])": 1}
    assert result["recovered_s"] == 51.0 and result["first_failure_s"] == 1.0
    assert (result["completed"], result["wrong_answers"], result["ended_by_fault"]) == (3, 0, False)


def test_a_request_in_flight_at_the_next_fault_is_that_faults_not_this_ones() -> None:
    """Seen on the CPU (2026-12-05): a stream started during the KV cut's hold was cut 0.8 s after
    the runbook's decode replacement, the next fault; it was counted as the KV cut's failure, and
    the KV cut as never served again."""
    found = events(
        outcome(11.0, 12.0),
        outcome(12.0, 13.0),
        outcome(40.0, 50.8, text="the", finish_reason=None, done=False),  # cut by the next fault at 50
        outcome(50.5, 52.0),
        outcome(52.0, 53.0),
    )
    found.append({"type": "fault", "name": "g", "at": 50.0, "killed": [2], "hold_s": 0.0})
    first, second = judge(found, bound_s=240)
    assert first["requests_failed"] == 0 and first["recovered_s"] is not None
    assert second["requests_failed"] == 1 and second["in_flight_at_fault"] == 1


def test_a_text_the_control_gave_under_load_is_right_and_any_other_still_wrong() -> None:
    """Greedy decoding is not batch-invariant: on the GPU (2026-12-05) one engine serving two
    clients gave late-diverging texts that neither reference had. With ``--control-load-s`` the
    control's own texts under that load count as right; a text it never gave stays wrong."""
    late = "the answeR"
    found = events(outcome(11.0, 12.0, text=late), outcome(12.0, 13.0, text="garbage"), outcome(13.0, 14.0))
    (result,) = judge(found, bound_s=240)
    assert result["wrong_answers"] == 2
    found[0]["control_under_load"] = {"p": [RIGHT, late]}
    (result,) = judge(found, bound_s=240)
    assert result["wrong_answers"] == 1  # "garbage" is no text the control ever gave


def tokens(*chosen: tuple[int, dict[int, float]]) -> list[list[Any]]:
    """An answer's tokens as a stream gives them: each chosen token and its top two logprobs."""
    return [[f"token_id:{t}", {f"token_id:{k}": lp for k, lp in top.items()}] for t, top in chosen]


# The reference (the PD app's own answer) and its tokens: at the third token, 7 leads 9 by 0.001.
REFERENCE = tokens((1, {1: -0.1, 2: -3.0}), (5, {5: -0.2, 6: -2.5}), (7, {7: -1.000, 9: -1.001}))


def test_an_answer_that_leaves_every_right_text_at_a_near_tie_is_right_and_at_any_other_token_wrong() -> None:
    """GPU, 2026-12-05: one late text (35 of 40 characters the PD app's) that the control never gave
    under load. Whether such a text is right is decided where it leaves a right one: each text's
    token there must be in the other's top two (vLLM's check_logprobs_close with N = 2)."""
    flipped = tokens((1, {1: -0.1, 2: -3.0}), (5, {5: -0.2, 6: -2.5}), (9, {9: -1.0005, 7: -1.0007}))
    other_kv = tokens((1, {1: -0.1, 2: -3.0}), (5, {5: -0.2, 6: -2.5}), (4, {4: -0.5, 8: -2.0}))
    found = events(
        outcome(11.0, 12.0, text="the answeR", tokens=flipped),
        outcome(12.0, 13.0, text="the answer, not", tokens=other_kv),  # 7 is not in its top two
        outcome(13.0, 14.0, text="the answeR"),  # no logprobs: nothing shows a near tie
        outcome(14.0, 15.0, tokens=REFERENCE),
    )
    found[0]["reference_tokens"] = {"p": [REFERENCE]}
    (result,) = judge(found, bound_s=240)
    assert (result["wrong_answers"], result["near_tie_answers"], result["near_tie_gap_max"]) == (2, 1, 0.0002)
    assert result["answers_without_logprobs"] == 1
    # Events from before the logprobs (no reference tokens): every such text is wrong, as it was.
    del found[0]["reference_tokens"]
    (result,) = judge(found, bound_s=240)
    assert (result["wrong_answers"], result["near_tie_answers"]) == (3, 0)


def test_a_near_tie_is_only_where_the_texts_first_part_and_each_token_is_in_the_others_top_two() -> None:
    assert near_tie(REFERENCE, REFERENCE) is None  # never differ
    assert near_tie(REFERENCE[:2], REFERENCE) is None  # a prefix: shorter, not a near tie
    later = tokens((1, {1: -0.1, 2: -3.0}), (6, {6: -0.3, 5: -0.31}), (9, {9: -1.0, 7: -1.1}))
    assert near_tie(later, REFERENCE) == pytest.approx(0.01)  # the first divergence decides, not the later ones
    one_way = tokens((1, {1: -0.1, 2: -3.0}), (6, {6: -0.3, 5: -0.31}))
    assert near_tie(one_way, tokens((1, {1: -0.1, 2: -3.0}), (5, {5: -0.2, 8: -0.25}))) is None


def test_an_error_status_and_a_wrong_answer_are_counted() -> None:
    (result,) = judge(
        events(
            outcome(9.5, 10.5, status=500, error='{"error": "Internal Server Error"}'),
            outcome(11.0, 12.0, text="another answer"),
            outcome(12.0, 13.0),
        ),
        bound_s=240,
    )
    assert result["failures"] == {'HTTP 500: {"error": "Internal Server Error"}': 1}
    assert result["wrong_answers"] == 1


def test_a_fault_that_never_recovers_has_no_recovery_time() -> None:
    dead = [outcome(11.0 + i, 12.0 + i, status=None, error="ConnectError: refused") for i in range(5)]
    (result,) = judge(events(*dead, hold_s=90.0, ended=False), bound_s=240)
    assert result["recovered_s"] is None and result["requests_failed"] == 5
    assert result["ended_by_fault"] is True  # the events stop: the fault took the recorder down


def test_a_gcs_restarted_from_its_store_counts_what_was_served_while_it_was_down() -> None:
    recorded = events(outcome(9.0, 11.0), outcome(10.5, 13.0), outcome(13.0, 15.5), outcome(15.5, 16.0))
    recorded.insert(2, {"type": "gcs_restarted", "at": 15.0})
    (result,) = judge(recorded, bound_s=240)
    # Down 5 s: two answers finished meanwhile (one in flight at the kill); of the two requests
    # started while it was down, both completed (one after the restart).
    assert (result["gcs_down_s"], result["completed_while_gcs_down"], result["requests_failed"]) == (5.0, 2, 0)
    assert result["started_while_gcs_down"] == [2, 2]


def _report(
    gcs: dict[str, Any], state: dict[str, Any] | None, fault_tolerant: bool = True, kv: dict[str, Any] | None = None
) -> dict[str, Any]:
    replica = {"fault": "decode replica killed", "recovered_s": 50.0, "wrong_answers": 0}
    faults = [replica, {**replica, "fault": "prefill replica killed"}]
    if kv is not None:
        faults.append({**KV_CUT, **kv})
    return {
        "faults_chosen": ["decode", "prefill", *(["kv"] if kv is not None else []), "gcs"],
        "kv_load_failure_policy": "recompute",
        "kv_pull_failed_lines": 19 if kv is not None else 0,
        "gcs_fault_tolerance": fault_tolerant,
        "state_after_gcs_restart": state,
        "faults": [*faults, {"fault": "GCS killed", "wrong_answers": 0, **gcs}],
    }


KV_CUT = {
    "fault": "KV link cut",
    "recovered_s": 1.4,
    "wrong_answers": 0,
    "requests_failed": 0,
    "kv_cut_s": 10.3,
    "kv_failed_transfers_while_cut": 22.0,
    "kv_transfers_after_heal": 58.0,
}


FOUND = {"controller_found": True}


def test_with_a_store_the_gcs_fault_must_fail_nothing_serve_meanwhile_and_keep_the_controller() -> None:
    assert holds(_report({"requests_failed": 0, "completed_while_gcs_down": 2}, FOUND))
    # Each of these breaks it: a failed request, nothing served while down, the controller lost.
    assert not holds(_report({"requests_failed": 1, "completed_while_gcs_down": 2}, FOUND))
    assert not holds(_report({"requests_failed": 0, "completed_while_gcs_down": 0}, FOUND))
    assert not holds(_report({"requests_failed": 0, "completed_while_gcs_down": 2}, {"controller_found": False}))
    assert not holds(_report({"requests_failed": 0, "completed_while_gcs_down": 2}, None))


def test_without_a_store_the_gcs_fault_may_take_the_cluster_down_but_no_answer_may_be_wrong() -> None:
    dead = {"requests_failed": 4, "recovered_s": None}
    assert holds(_report(dead, None, fault_tolerant=False))
    assert not holds(_report({**dead, "wrong_answers": 1}, None, fault_tolerant=False))


def test_an_answer_is_wrong_only_when_it_is_neither_the_pd_apps_nor_the_colocated_controls() -> None:
    (result,) = judge(
        events(
            outcome(11.0, 12.0), outcome(12.0, 13.0, text=LOCAL), outcome(13.0, 14.0, text="garbage"), control=LOCAL
        ),
        bound_s=240,
    )
    assert (result["completed"], result["answered_as_control"], result["wrong_answers"]) == (3, 1, 1)


def test_the_kv_links_cut_is_measured_by_the_engines_counters_at_the_cut_the_heal_and_the_end() -> None:
    def link(event: str, at: float, failed: float, moved: float) -> dict[str, Any]:
        counters = {"nixl_failed_transfers": failed, "nixl_transfers": moved, "external_kv_tokens": 10 * moved}
        return {"type": "kv_link", "event": event, "at": at, "counters": counters, "connections": 30}

    # The fault is recorded at 10.0; the link is cut at 12.0 (the counters are read first): the
    # request that ended before the cut is not the cut's.
    recorded = events(outcome(10.5, 11.5), outcome(12.5, 13.0), outcome(13.0, 14.0))
    recorded[2:2] = [link("cut", 12.0, 0, 15), link("healed", 22.3, 22, 16), link("end", 45.0, 24, 74)]
    (result,) = judge(recorded, bound_s=240)
    assert (result["requests_affected"], result["recovered_s"]) == (2, 2.0)
    assert (result["kv_cut_s"], result["kv_connections_cut"]) == (10.3, 30)
    assert (result["kv_failed_transfers_while_cut"], result["kv_failed_transfers_after_heal"]) == (22, 2)
    assert (result["kv_transfers_while_cut"], result["kv_transfers_after_heal"]) == (1, 58)
    assert result["kv_external_tokens_after_heal"] == 580


def test_the_kv_cut_must_fail_pulls_recover_carry_kv_again_and_under_recompute_fail_no_request() -> None:
    gcs = {"requests_failed": 0, "completed_while_gcs_down": 2}
    assert holds(_report(gcs, FOUND, kv={}))
    # Each of these breaks it: no pull failed (the cut missed NIXL), the healed link carried no
    # KV, a request failed under recompute, a wrong answer, no recovery within the bound.
    assert not holds(_report(gcs, FOUND, kv={"kv_failed_transfers_while_cut": 0.0}))
    assert not holds(_report(gcs, FOUND, kv={"kv_transfers_after_heal": 0.0}))
    assert not holds(_report(gcs, FOUND, kv={"requests_failed": 1}))
    assert not holds(_report(gcs, FOUND, kv={"wrong_answers": 1}))
    assert not holds(_report(gcs, FOUND, kv={"recovered_s": None}))
    # The engines logged no line for the alarm to count.
    assert not holds({**_report(gcs, FOUND, kv={}), "kv_pull_failed_lines": 0})
    # Under fail, a failed pull is the client's error to retry.
    assert holds({**_report(gcs, FOUND, kv={"requests_failed": 3}), "kv_load_failure_policy": "fail"})
    # A chosen fault that never ran.
    assert not holds({**_report(gcs, FOUND), "faults_chosen": ["decode", "prefill", "kv", "gcs"]})


def test_with_the_kv_guard_on_it_must_trip_at_a_counted_pull_and_decode_must_be_replaced() -> None:
    """Under the guard requests fail by design (its 503s) even under recompute; what must hold is
    that it tripped when a pull failed and that Serve replaced decode (a new replica at the end)."""
    gcs = {"requests_failed": 0, "completed_while_gcs_down": 2}
    refused = {"requests_failed": 12, "failures": {"HTTP 503: decode could not pull": 12}}
    guarded = {**_report(gcs, FOUND, kv={**refused, "kv_replicas_new_at_end": ["n3w"]}),
               "kv_guard": {"on": 2, "aside": 1, "tripped": 1}}  # fmt: skip
    assert holds(guarded)
    assert not holds({**guarded, "kv_guard": {"on": 2, "aside": 1, "tripped": 0}})  # a failed pull, no trip
    stuck = {**_report(gcs, FOUND, kv={**refused, "kv_replicas_new_at_end": []}), "kv_guard": guarded["kv_guard"]}
    assert not holds(stuck)  # decode never replaced
    # The same failures without a guard: under recompute, a request may not fail.
    assert not holds({**guarded, "kv_guard": {"on": 0, "aside": 2, "tripped": 0}})
    # An engine that died of the cut (no pull counted) still passes when Serve replaced it and none was wrong.
    died = _report(gcs, FOUND, kv={**refused, "kv_failed_transfers_while_cut": 0.0, "kv_replicas_new_at_end": ["n"]})
    assert holds({**died, "kv_guard": {"on": 2, "aside": 1, "tripped": 0}})


def test_the_runbooks_replacement_must_find_a_decode_replica_and_serve_again() -> None:
    gcs = {"requests_failed": 0, "completed_while_gcs_down": 2}
    replaced = {"fault": REPLACED, "killed": ["SERVE_REPLICA::pd-openai#Decode:m#a1"], "recovered_s": 50.0}
    report = _report(gcs, FOUND)
    report["faults"].insert(2, {**replaced, "wrong_answers": 0})
    report["faults_chosen"].insert(2, "replace")
    assert holds(report)
    report["faults"][2] = {**replaced, "wrong_answers": 0, "killed": []}  # found nothing to replace
    assert not holds(report)
    report["faults"][2] = {**replaced, "wrong_answers": 0, "recovered_s": None}  # never served again
    assert not holds(report)


def test_the_kv_fault_without_iptables_stops_before_anything_starts_with_one_line(tmp_path: Path) -> None:
    report = tmp_path / "faults.json"
    command = [sys.executable, "-m", "rehearsal.faults", "--faults", "kv", "--report", str(report)]
    env = {"PATH": str(tmp_path), "PYTHONPATH": f"{ROOT}:{ROOT / 'constructs'}"}  # no iptables on it
    ran = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert ran.returncode == 2 and "Traceback" not in ran.stdout + ran.stderr
    assert ran.stdout.strip() == "FAIL: iptables not found. Fix: apt-get install iptables (make rehearse-faults does)"
    assert not report.exists() and not report.with_suffix(".events.jsonl").exists()
    # An iptables that cannot read the filter table (no root, no CAP_NET_ADMIN): the same, its own line.
    fake = tmp_path / "iptables"
    fake.write_text("#!/bin/sh\necho 'Permission denied (you must be root)' >&2\nexit 4\n")
    fake.chmod(0o755)
    ran = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert ran.returncode == 2 and "Traceback" not in ran.stdout + ran.stderr
    assert ran.stdout.strip().startswith("FAIL: iptables cannot read the filter table. Fix: run the KV fault as root")
    assert not report.exists()
    fake.unlink()
    # A fault's name that is not one: argparse's own refusal, naming the setting and the choices.
    ran = subprocess.run([*command[:4], "kv,disk"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert (
        ran.returncode == 2
        and "--faults: 'kv,disk': name one or more of hostile,decode,poison,prefill,new-disk,kv,replace,update,gcs"
        in ran.stderr
    )


def test_failures_are_counted_by_kind_without_request_ids_and_the_bounds_are_measured() -> None:
    """Serve names each request in its error body; counted by kind they would all be singletons
    (the 2026-12-03 control's 308 failures read as 308 kinds). The in-flight bound is from the
    fault, the failed one from each request's own start: a request queued after the fault until
    the client's timeout is the longest failure, not an in-flight one."""
    body = '{"error":{"message":"Message: Internal Server Error (Request ID: %s)"}}'
    (result,) = judge(
        events(
            outcome(9.5, 10.1, status=500, error=body % "db137927-23b6-48ec-b47b-f5f4253e9666"),
            outcome(9.8, 10.2, status=500, error=body % "cc33edad-4774-450b-8d0d-e2a298a3ba10"),
            outcome(10.3, 130.3, status=None, error="ReadTimeout: timed out", text=""),
            outcome(130.5, 131.0),
            outcome(131.0, 132.0),
        ),
        bound_s=240,
    )
    assert result["failures"] == {
        'HTTP 500: {"error":{"message":"Message: Internal Server Error (Request ID: <id>)"}}': 2,
        "no response (ReadTimeout: timed out)": 1,
    }
    assert round(result["in_flight_ended_s"], 3) == 0.2
    assert round(result["longest_failed_s"], 3) == 120.0


def test_the_update_fault_is_one_redeploy_per_change_each_bounded_and_the_slowest_request_is_measured() -> None:
    """The update fault makes each change of ``UPDATES`` in turn (a prefill, a decode, a both-phase
    engine change, an autoscaling target, a failover setting): one injection each, each must serve
    again with no wrong answer and, with the failover (each phase its own application), fail no
    request; a request Serve held during the switch is the window's slowest, whether or not it failed."""
    update = {"recovered_s": 2.0, "wrong_answers": 0, "requests_failed": 0}
    changes = [{**update, "fault": f"{name} changed, serve config redeployed"} for name in UPDATES.values()]
    report = {"faults_chosen": ["update"], "gcs_fault_tolerance": False, "faults": changes}
    assert holds(report)
    assert not holds({**report, "faults": changes[:2]})
    assert not holds({**report, "faults": [*changes[:-1], {**changes[-1], "recovered_s": None}]})
    # One refused request fails it with the failover, not without (Ray's one application).
    refused = [*changes[:-1], {**changes[-1], "requests_failed": 1}]
    assert holds({**report, "faults": refused})
    assert not holds({**report, "faults": refused, "failover": {"wait_s": 2.0}})
    assert holds({**report, "failover": {"wait_s": 2.0}})
    (result,) = judge(events(outcome(9.0, 10.5), outcome(10.6, 80.6), outcome(80.7, 81.0), outcome(81.0, 81.5)), 240)
    assert result["requests_failed"] == 0 and round(result["slowest_s"], 1) == 70.0


def test_recorded_events_are_judged_again_by_another_runs_right_answers(tmp_path: Path) -> None:
    """``--judge-events`` runs nothing: a run made without the control (its own PD answers the only
    right ones) is judged by the right answers a control run recorded on the same stack."""
    without = events(outcome(11.0, 12.0, text=LOCAL), outcome(12.0, 13.0, text="the answeR", tokens=[]))
    control = events(control=LOCAL)
    control[0]["control_under_load"] = {"p": [LOCAL, "the answeR"]}
    # The control's answers under load are on record by type of their own, apart from the faults'.
    for text in (LOCAL, LOCAL, "the answeR"):
        control.append({**outcome(1.0, 2.0, text=text), "type": CONTROL_OUTCOME})
    control.append({**outcome(2.0, 3.0, status=None, error="ReadTimeout", done=False), "type": CONTROL_OUTCOME})
    recorded, references = tmp_path / "run.events.jsonl.gz", tmp_path / "control.events.jsonl"
    with gzip.open(recorded, "wt") as out:
        out.writelines(json.dumps(e) + "\n" for e in without)
    references.write_text("".join(json.dumps(e) + "\n" for e in control))
    report = tmp_path / "judged.json"
    assert main(["--judge-events", str(recorded), "--report", str(report)]) == 1
    assert json.loads(report.read_text())["faults"][0]["wrong_answers"] == 2
    judged = ["--judge-events", str(recorded), "--references-from", str(references), "--report", str(report)]
    assert main(judged) == 0
    judgement = json.loads(report.read_text())
    (fault,) = judgement["faults"]
    assert (fault["completed"], fault["wrong_answers"], fault["answered_as_control"]) == (2, 0, 1)
    assert judgement["control_under_load"] == {"p": {"answers": 3, "by_text": {LOCAL: 2, "the answeR": 1}}}


def test_judging_a_file_that_is_no_runs_events_is_one_line_and_writes_nothing(tmp_path: Path, capsys: Any) -> None:
    report = tmp_path / "judged" / "faults.json"
    for path, why in (
        (tmp_path / "missing.jsonl", "cannot read it (FileNotFoundError)"),
        (tmp_path / "faults.json", "cannot read it (JSONDecodeError)"),
        (tmp_path / "early.events.jsonl", "no answers recorded (the run ended before its first fault)"),
    ):
        if path.name == "faults.json":
            path.write_text(json.dumps({"faults": []}, indent=2))
        if path.name.startswith("early"):
            path.write_text(json.dumps({"type": "gcs_store", "on": False}) + "\n")
        assert main(["--judge-events", str(path), "--report", str(report)]) == 2
        (line,) = capsys.readouterr().out.strip().splitlines()
        assert line.startswith(f"FAIL: --judge-events {path}: {why}") and not report.parent.exists()


def test_the_verdict_reads_each_faults_key_not_its_title() -> None:
    """A fault recorded with its key is judged by it, whatever its title says; an older recording
    without keys is read by its title."""
    gcs = {"requests_failed": 0, "completed_while_gcs_down": 2}
    report = _report(gcs, FOUND)
    assert holds(report)
    decode = report["faults"][0]
    report["faults"][0] = {**decode, "fault": "the first engine stopped", "key": "decode", "recovered_s": None}
    assert not holds(report)  # still a decode kill: it must serve again within the bound
    report["faults"][0] = {**decode, "fault": "the first engine stopped", "key": "decode"}
    assert holds(report)
    assert [fault_key(t) for t in ("decode replica killed", "KV link cut", REPLACED, "GCS killed (no fault tolerance)",
                                   f"{UPDATES['both']} changed, serve config redeployed")] == [
        "decode", "kv", "replace", "gcs", "update:both"]  # fmt: skip


def test_each_request_of_the_load_is_a_client_of_its_own() -> None:
    """The failover refuses a body identical to one whose engine died, for its cooldown: the load's
    requests differ by ``user`` alone (which the ingress allows), so only a resend is refused so."""
    from rehearsal.faults.load import stream_body
    from rehearsal.probes import Endpoint

    endpoint = Endpoint("http://127.0.0.1:1", "m", "http://127.0.0.1:1/metrics")
    first, second = stream_body(endpoint, "p"), stream_body(endpoint, "p")
    assert first["user"] != second["user"]
    assert {k: v for k, v in first.items() if k != "user"} == {k: v for k, v in second.items() if k != "user"}
