"""The fault rehearsal's judgement (rehearsal/faults.py) on recorded events: which requests a
fault touched, how each ended as a client saw it, the recovery time, wrong answers. The faults
themselves run in `make rehearse-faults` (docs/features/failures.md has a run's table)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from rehearsal.faults import Outcome, holds, judge

RIGHT = "the answer"


def outcome(started: float, ended: float, **kind: Any) -> dict[str, Any]:
    fields = {"status": 200, "error": None, "text": RIGHT, "finish_reason": "length", "done": True, **kind}
    return {"type": "outcome", **asdict(Outcome("p", started, ended, **fields))}


def events(*outcomes: dict[str, Any], hold_s: float = 0.0, ended: bool = True) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = [
        {"type": "expected", "answers": {"p": RIGHT}},
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


def _report(gcs: dict[str, Any], state: dict[str, Any] | None, fault_tolerant: bool = True) -> dict[str, Any]:
    replica = {"fault": "decode replica killed", "recovered_s": 50.0, "wrong_answers": 0}
    return {
        "gcs_fault_tolerance": fault_tolerant,
        "state_after_gcs_restart": state,
        "faults": [
            replica,
            {**replica, "fault": "prefill replica killed"},
            {"fault": "GCS killed", "wrong_answers": 0, **gcs},
        ],
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
