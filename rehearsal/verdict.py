"""Judge a rehearsal report: what passed, as a table a person reads."""

from __future__ import annotations

from typing import Any

_HEADER = (
    f"{'request':<11} {'prompt':<45} {'p.tok':>5} {'KV ext':>6} {'NIXL':>4} {'bytes':>8} "
    f"{'TTFT s':>7} {'tok/s':>6}  same as colocated"
)


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def kv_moved(request: dict[str, Any], all_but_last: bool = True) -> bool:
    """Decode loaded the prompt's KV from prefill through a NIXL transfer: all but the last token
    (``all_but_last``), or at least one token and not the last."""
    engine = request["engine"]
    external, prompt = engine["external_kv_tokens"], request["prompt_tokens"]
    loaded = external == prompt - 1 if all_but_last else 1 <= external <= prompt - 1
    return bool(loaded and engine["nixl_transfers"] >= 1 and engine["nixl_bytes"] > 0)


def _row(ours: dict[str, Any], same: bool) -> str:
    engine = ours["engine"]
    return (
        f"{ours['kind']:<11} {ours['prompt'][:45]:<45} {ours['prompt_tokens']:>5} "
        f"{engine['external_kv_tokens']:>6.0f} {engine['nixl_transfers']:>4.0f} {engine['nixl_bytes']:>8.0f} "
        f"{_fmt(ours.get('ttft_s'), '7.3f'):>7} {_fmt(ours.get('tokens_per_s'), '6.1f'):>6}  "
        f"{'yes' if same else 'NO'}"
    )


def judge(report: dict[str, Any], strict: bool = True) -> tuple[bool, list[str]]:
    """Every request's KV moved, the control moved none. ``strict`` (the CPU rehearsal, float32):
    decode loaded all but the last prompt token and PD's text equals the colocated engine's. On
    GPUs (bfloat16, hybrid-model block alignment) a decode step over transferred KV and a full
    prefill run different kernels, so greedy outputs of a random-weight model may part: they are
    counted, not failed, and the KV tokens loaded are shown per request."""
    pd, colocated = report["pd"], report["colocated"]
    lines = [
        f"time to healthy: PD {pd['ready_s']:.1f} s after deploy, {pd['ready_from_start_s']:.1f} s "
        f"after start; colocated {colocated['ready_s']:.1f} s",
        "",
        _HEADER,
    ]
    failures = []
    for ours, theirs in zip(pd["requests"], colocated["requests"], strict=True):
        same = ours["text"] == theirs["text"]
        lines.append(_row(ours, same))
        name = f"{ours['kind']} {ours['prompt']!r}"
        if not kv_moved(ours, all_but_last=strict):
            failures.append(f"{name}: no evidence decode loaded the KV from prefill: {ours['engine']}")
        if not same and strict:
            failures.append(f"{name}: PD output {ours['text']!r} != colocated {theirs['text']!r}")
        if theirs["engine"]["external_kv_tokens"] or theirs["engine"]["nixl_transfers"]:
            failures.append(f"negative control moved KV without a connector: {theirs['engine']}")
    control = [r["engine"] for r in colocated["requests"]]
    external = sum(e["external_kv_tokens"] for e in control)
    transfers = sum(e["nixl_transfers"] for e in control)
    errors = pd["errors"]
    matching = sum(o["text"] == t["text"] for o, t in zip(pd["requests"], colocated["requests"], strict=True))
    lines += [
        f"outputs identical to the control: {matching} of {len(pd['requests'])}"
        + ("" if strict else " (reported, not judged: bfloat16 kernels differ)"),
        f"negative control (one engine, no connector): {len(control)} requests, "
        f"KV ext {external:.0f} tokens, NIXL transfers {transfers:.0f}",
        f"errors: malformed -> HTTP {errors['malformed']}, unknown model -> HTTP {errors['unknown_model']}",
    ]
    passed = "PASS: every request's KV came from prefill over NIXL" + (
        "; outputs match one colocated engine" if strict else ""
    )
    lines += [f"FAIL: {f}" for f in failures] or [passed]
    return not failures, lines
