"""``python -m rehearsal.faults``: the arguments (parsed once into ``RunArgs``, the same for the CPU
and the GPU), the parent that starts the child and judges its events whatever became of it, and
``--judge-events``, which judges a recorded run again."""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from eks_pd_serving.fault_tolerance import kv_guard
from eks_pd_serving.observability import catalogue as om
from eks_pd_serving.observability import replica_start

from ..harness import PROMPTS, kill_marked, log, serve_log_lines
from ..processes import MARKER
from . import registry
from .child import run_child
from .fault import Fault, RunArgs
from .judge import answers_judged, control_texts, holds, judge, read_events
from .load import STREAMS
from .update import UPDATES

USAGE = """
    .venv-rehearse/bin/python -m rehearsal.faults --template cdk.out/RayLlmPdServing.template.json
    python -m rehearsal.faults --gpu --faults kv   # NVIDIA GPUs, the image's stack on PYTHONPATH
    python -m rehearsal.faults --judge-events RUN.events.jsonl.gz [--references-from CONTROL.events.jsonl.gz]

The faults (docs/development/rehearsals.md has what each injects, how it heals, what it must show):
""" + "\n".join(f"    {f.key:8} {f.injects}" for f in registry.FAULTS)


class Output:
    """The child's output (the engines' and Ray's too), passed through as it comes, and the lines
    the ``KvPullFailed`` alarm's filter counts on the cluster."""

    def __init__(self, child: subprocess.Popen[str]) -> None:
        self.pull_failed_lines = 0
        # Every line (the engines' among them), for the replica starts' split.
        self.lines: list[str] = []
        # The KV guard's lines (Serve logs them to stderr here, as in a pod; its log files buffer).
        self.guard_lines = dict.fromkeys(kv_guard.lines(), 0)
        self._thread = threading.Thread(target=self._read, args=(child,), daemon=True)
        self._thread.start()

    def _read(self, child: subprocess.Popen[str]) -> None:
        assert child.stdout is not None
        for line in child.stdout:
            sys.stdout.write(line)
            self.lines.append(line)
            self.pull_failed_lines += om.KV_PULL_FAILED_LINE in line
            for what, phrase in kv_guard.lines().items():
                self.guard_lines[what] += f"{phrase}:" in line

    def join(self) -> None:
        self._thread.join(timeout=30)


def _names(known: tuple[str, ...]) -> Any:
    def parse(value: str) -> tuple[str, ...]:
        chosen = tuple(v.strip() for v in value.split(",") if v.strip())
        if not chosen or any(v not in known for v in chosen):
            raise argparse.ArgumentTypeError(f"{value!r}: name one or more of {','.join(known)}, comma-separated")
        return tuple(k for k in known if k in chosen)  # always in the rehearsal's order

    return parse


def _parser() -> argparse.ArgumentParser:
    description = f"{sys.modules[__package__].__doc__}\n{USAGE}"
    parser = argparse.ArgumentParser(prog="python -m rehearsal.faults", description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--template", type=Path, default=Path("cdk.out/RayLlmPdServing.template.json"))
    parser.add_argument("--checkpoint", type=Path, default=Path(".rehearsal/tiny-checkpoint"))
    parser.add_argument("--report", type=Path, default=Path(".rehearsal/faults.json"))
    parser.add_argument("--timeout-s", type=float, default=240.0)
    parser.add_argument("--recovery-bound-s", type=float, default=240.0)
    parser.add_argument(
        "--gpu", action="store_true", help="on NVIDIA GPUs with the image's stack (Ray 2.58, vLLM 0.26)"
    )
    parser.add_argument("--weights", type=Path,
                        help="with --gpu: this checkpoint folder (the 9B's full-weights) served through the node "
                             "cache as a warm node holds it (default: the tiny checkpoint, no node cache)")  # fmt: skip
    parser.add_argument("--streams", type=int, default=STREAMS, help=f"concurrent clients ({STREAMS})")
    parser.add_argument("--no-control", action="store_true",
                        help="skip the colocated control (saves an engine start on a GPU)")  # fmt: skip
    keys = registry.KEYS
    parser.add_argument("--faults", type=_names(keys), default=keys,
                        help=f"comma-separated, of {','.join(keys)} (all)")  # fmt: skip
    parser.add_argument("--updates", type=_names(tuple(UPDATES)), default=tuple(UPDATES),
                        help=f"the update fault's changes, of {','.join(UPDATES)} (all)")  # fmt: skip
    parser.add_argument("--control-load-s", type=float, default=0.0,
                        help="also serve the colocated control under the clients' load this long; its texts count "
                             "as right (0: off)")  # fmt: skip
    parser.add_argument("--judge-events", type=Path,
                        help="run nothing: judge a run's recorded events (.events.jsonl, or .gz) into "
                             "--report")  # fmt: skip
    parser.add_argument("--references-from", type=Path,
                        help="with --judge-events: the right answers (control, under load, tokens) of this other "
                             "run's events")  # fmt: skip
    parser.add_argument("--child", help=argparse.SUPPRESS)  # the parent's RunArgs, as JSON
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    for noisy in ("httpx", "ray", "ray.serve", "vllm"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.child:
        return run_child(RunArgs.from_json(args.child))
    if args.judge_events:
        return _judge_recorded(args)
    # The packet filter's chain is the run's own (iptables chain names: at most 28 characters).
    run = RunArgs(args.template, args.checkpoint, args.report, args.faults, args.updates, args.timeout_s,
                  args.recovery_bound_s, args.gpu, args.streams, args.no_control, args.control_load_s,
                  kv_chain=f"EKSPD-KV-{os.getpid()}",
                  weights=str(args.weights.resolve()) if args.weights else "")  # fmt: skip
    faults = registry.chosen(run.faults)
    if run.weights and not (run.gpu and Path(run.weights, "config.json").is_file()):
        log(f"FAIL: --weights {run.weights}: needs --gpu and a checkpoint folder with config.json. Fix: make one "
            "with ../shared/gpu/cold_start.py gen DIR, or drop --weights")  # fmt: skip
        return 2
    try:
        for fault in faults:
            fault.preflight()
    except RuntimeError as exc:
        log(f"FAIL: {exc}")
        return 2
    run.report.parent.mkdir(parents=True, exist_ok=True)
    run.events.unlink(missing_ok=True)
    report = _run(run, faults)
    run.report.write_text(json.dumps(report, indent=2))
    for fault in report["faults"]:
        log(
            f"{fault['fault']}: {fault['requests_failed']} of {fault['requests_affected']} failed {fault['failures']}; "
            f"recovered in {fault['recovered_s']} s; first failure at {fault['first_failure_s']} s; "
            f"{answers_judged(fault)}"
        )
    ok = holds(report)
    log(f"{'PASS' if ok else 'FAIL'}: faults rehearsed; report in {run.report}")
    return 0 if ok else 1


def _run(run: RunArgs, faults: tuple[Fault, ...]) -> dict[str, Any]:
    """The child, bounded, then every process it left stopped and each fault's cleanup done; the
    report from its events."""
    run_id = os.environ.get(MARKER) or f"faults-{os.getpid()}"
    command = [sys.executable, "-m", "rehearsal.faults", "--child", run.to_json()]
    bound_s = 2 * run.timeout_s + run.control_load_s + len(run.faults) * (run.recovery_bound_s + 100) + 300
    child = subprocess.Popen(command, env={**os.environ, MARKER: run_id}, start_new_session=True, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, errors="replace")  # fmt: skip
    output = Output(child)
    try:
        exit_code: int | None = child.wait(timeout=bound_s)
    except subprocess.TimeoutExpired:
        exit_code = None
    finally:
        stopped = kill_marked(run_id)
        for fault in faults:
            fault.cleanup(run)
    events = [json.loads(line) for line in run.events.read_text().splitlines()] if run.events.exists() else []
    judged = judge(events, run.recovery_bound_s) if any(e["type"] == "expected" for e in events) else []
    store = next((e["on"] for e in events if e["type"] == "gcs_store"), None)
    state = next((e for e in events if e["type"] == "state_after_restart"), None)
    usage = next(({k: v for k, v in e.items() if k != "type"} for e in events if e["type"] == "gcs_store_usage"), None)
    expected = next((e for e in events if e["type"] == "expected"), None)
    differs = expected and [p for p in PROMPTS if expected["control"][p] != expected["pd"][p]]
    report = {"child_exit": exit_code, "leftovers_stopped": stopped, "recovery_bound_s": run.recovery_bound_s,
              "streams": run.streams, "gpu": run.gpu, "faults_chosen": list(run.faults),
              "updates_chosen": list(run.updates),
              "kv_load_failure_policy": expected and expected["kv_load_failure_policy"],
              "failover": expected and expected.get("failover"),
              "pd_differs_from_control": differs,
              "gcs_fault_tolerance": store, "state_after_gcs_restart": state, "gcs_store_usage": usage,
              "control_under_load": control_texts(events), "faults": judged}  # fmt: skip
    output.join()
    logs = next((Path(e["dir"]) for e in events if e["type"] == "ray_logs"), None)
    report["replica_starts"] = starts_by_fault(events, judged, output.lines, logs)
    report["kv_pull_failed_lines"] = output.pull_failed_lines
    # The decode engines' KV guard: started on, stood aside (a vLLM that handles failed pulls), tripped.
    report["kv_guard"] = output.guard_lines
    return report


def starts_by_fault(events: list[dict[str, Any]], judged: list[dict[str, Any]], lines: list[str],
                    logs: Path | None) -> list[dict[str, Any]]:  # fmt: skip
    """Every engine replica's start in its parts (observability/replica_start.py, from Serve's log
    files and the engines' lines); each judged fault gets the starts that followed it
    (``replica_start``) beside its ``disaggregated_again_s``."""
    starts = replica_start.engine_starts([*lines, *(serve_log_lines(logs) if logs else [])])
    faults = [e for e in events if e["type"] == "fault"]
    for index, (fault, result) in enumerate(zip(faults, judged, strict=False)):
        since = datetime.datetime.fromtimestamp(fault["at"]) - datetime.timedelta(seconds=1)
        until = datetime.datetime.fromtimestamp(faults[index + 1]["at"]) if index + 1 < len(faults) else None
        after = [s for s in starts if s.starting >= since and (until is None or s.starting < until)]
        result["replica_start"] = [s.summary() for s in after]
        for start in after:
            log(f"{result['fault']}: {start.line()}")
    return [s.summary() for s in starts]


def _judge_recorded(args: argparse.Namespace) -> int:
    """Judge recorded events again, optionally by another run's right answers (the same checkpoint
    and stack): a run made without the control, judged by one made with it."""
    try:
        events = read_events(args.judge_events, "--judge-events")
        control = read_events(args.references_from, "--references-from") if args.references_from else events
    except ValueError as exc:
        log(f"FAIL: {exc}")
        return 2
    if control is not events:  # the other run's right answers replace this one's (its PD answers stay)
        theirs = next(e for e in control if e["type"] == "expected")
        keys = ("control", "control_under_load", "reference_tokens")
        events = [{**e, **{k: theirs.get(k) for k in keys}} if e["type"] == "expected" else e for e in events]
    faults = judge(events, args.recovery_bound_s)
    args.report.parent.mkdir(parents=True, exist_ok=True)
    references = args.references_from and str(args.references_from)
    report = {"judged_from": str(args.judge_events), "references_from": references,
              "recovery_bound_s": args.recovery_bound_s, "control_under_load": control_texts(control),
              "faults": faults}  # fmt: skip
    args.report.write_text(json.dumps(report, indent=2))
    for fault in faults:
        log(f"{fault['fault']}: {fault['requests_failed']} of {fault['requests_affected']} failed; "
            f"{answers_judged(fault)}")  # fmt: skip
    return 0 if all(f["wrong_answers"] == 0 for f in faults) else 1
