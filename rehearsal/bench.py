"""PD against colocated under one workload: long prompts arriving while decode streams run.

The workload (fixed seed): ``streams`` clients each send short prompts with fixed-length outputs
(``ignore_eos``) back to back for ``window_s`` seconds; meanwhile long prompts of
``long_prompt_tokens`` arrive every ``long_every_s`` seconds. For every streamed request the
client records when each token arrived. From that: time to first token (TTFT) and inter-token
latency (ITL) percentiles, output tokens per second, and a picture of ITL over time with the long
prompts' arrivals marked. Statistics and the report are plain Python (tested on CPU); the run
needs a serving endpoint.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

WORDS = tuple(
    [
        "prefill",
        "decode",
        "cache",
        "block",
        "transfer",
        "engine",
        "replica",
        "stream",
        "token",
        "prompt",
        "latency",
        "network",
        "memory",
        "kernel",
        "batch",
        "queue",
        "model",
        "serve",
        "cluster",
        "node",
        "fabric",
    ]
)


# Ray Serve LLM sends streamed tokens in batches every 50 ms (MODEL_RESPONSE_BATCH_TIMEOUT_MS in
# Ray 2.58), so a client sees gaps of ~0 (tokens of one batch) and ~50 ms; a gap of 90 ms or more
# means an engine step missed a batch: a stall the client feels.
STALL_S = 0.090


@dataclass(frozen=True)
class Workload:
    streams: int = 24
    stream_prompt_tokens: int = 128
    stream_output_tokens: int = 256
    long_prompts: int = 12
    long_prompt_tokens: int = 3000
    long_output_tokens: int = 16
    first_long_at_s: float = 5.0
    long_every_s: float = 2.5
    window_s: float = 40.0
    seed: int = 0

    def long_arrivals(self) -> list[float]:
        return [self.first_long_at_s + i * self.long_every_s for i in range(self.long_prompts)]


@dataclass
class Request:
    kind: str  # "stream" or "long"
    sent_s: float  # since the run started
    prompt_tokens: int = 0
    completion_tokens: int = 0
    token_s: list[float] = field(default_factory=list)  # arrival of each streamed chunk
    error: str = ""

    @property
    def ttft_s(self) -> float | None:
        return self.token_s[0] - self.sent_s if self.token_s else None

    def itl_s(self) -> list[float]:
        return [b - a for a, b in zip(self.token_s, self.token_s[1:], strict=False)]


def prompt_of(tokenizer: Any, tokens: int, rng: random.Random) -> str:
    """Random words that the model's tokenizer counts as ``tokens`` tokens (+-1 for merges)."""
    words: list[str] = []
    while len(tokenizer.encode(" ".join(words), add_special_tokens=False)) < tokens:
        words.extend(rng.choice(WORDS) for _ in range(max(1, (tokens - len(words)) // 4)))
    while len(words) > 1 and len(tokenizer.encode(" ".join(words), add_special_tokens=False)) > tokens:
        words.pop()
    return " ".join(words)


async def _stream(client: Any, model: str, prompt: str, max_tokens: int, record: Request, t0: float) -> None:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    try:
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                record.error = f"HTTP {resp.status_code}"
                return
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line.removeprefix("data: "))
                if chunk.get("usage"):
                    record.prompt_tokens = chunk["usage"]["prompt_tokens"]
                    record.completion_tokens = chunk["usage"]["completion_tokens"]
                # vLLM streams a chunk per engine step with new tokens, text or not (a random-
                # weight model's tokens often decode to nothing): each chunk is one step.
                if chunk.get("choices"):
                    record.token_s.append(time.monotonic() - t0)
    except Exception as error:  # a failed request is a result: counted, not raised
        record.error = f"{type(error).__name__}: {error}"


async def run(base_url: str, model: str, tokenizer: Any, workload: Workload) -> list[Request]:
    """Drive the workload against an OpenAI-compatible endpoint; every request's timings."""
    import httpx

    rng = random.Random(workload.seed)
    stream_prompts = [prompt_of(tokenizer, workload.stream_prompt_tokens, rng) for _ in range(workload.streams * 4)]
    long_prompts = [prompt_of(tokenizer, workload.long_prompt_tokens, rng) for _ in range(workload.long_prompts)]
    records: list[Request] = []
    limits = httpx.Limits(max_connections=workload.streams + workload.long_prompts + 4)
    async with httpx.AsyncClient(base_url=base_url, timeout=600, limits=limits) as client:
        t0 = time.monotonic()

        async def stream_client(index: int) -> None:
            turn = 0
            while time.monotonic() - t0 < workload.window_s:
                record = Request("stream", time.monotonic() - t0)
                records.append(record)
                prompt = stream_prompts[(index * 4 + turn) % len(stream_prompts)]
                await _stream(client, model, prompt, workload.stream_output_tokens, record, t0)
                turn += 1

        async def long_client(index: int, at_s: float) -> None:
            await asyncio.sleep(max(0.0, at_s - (time.monotonic() - t0)))
            record = Request("long", time.monotonic() - t0)
            records.append(record)
            await _stream(client, model, long_prompts[index], workload.long_output_tokens, record, t0)

        await asyncio.gather(
            *(stream_client(i) for i in range(workload.streams)),
            *(long_client(i, at) for i, at in enumerate(workload.long_arrivals())),
        )
    return records


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def summary(records: list[Request]) -> dict[str, Any]:
    """TTFT of the long prompts, ITL of the decode streams, output tokens per second."""
    ok = [r for r in records if not r.error and r.token_s]
    longs = [r for r in ok if r.kind == "long"]
    streams = [r for r in ok if r.kind == "stream"]
    itl = [gap for r in streams for gap in r.itl_s()]
    stream_ttft = [t for r in streams if (t := r.ttft_s) is not None]
    # Each stream's own decode rate, first to last token: not blurred by the 50 ms batching.
    rates = [
        (r.completion_tokens - 1) / (r.token_s[-1] - r.token_s[0]) for r in streams if r.token_s[-1] > r.token_s[0]
    ]
    long_ttft = [t for r in longs if (t := r.ttft_s) is not None]
    span = max((r.token_s[-1] for r in ok), default=0.0)
    ms = 1000.0

    def scaled(value: float | None) -> float | None:
        return None if value is None else value * ms

    return {
        "requests": len(records),
        "failed": sum(bool(r.error) for r in records),
        "long_prompt_tokens_median": statistics.median([r.prompt_tokens for r in longs]) if longs else None,
        "long_ttft_ms_p50": scaled(percentile(long_ttft, 50)),
        "long_ttft_ms_p99": scaled(percentile(long_ttft, 99)),
        "stream_ttft_ms_p50": scaled(percentile(stream_ttft, 50)),
        "stream_ttft_ms_p99": scaled(percentile(stream_ttft, 99)),
        "itl_ms_p50": scaled(percentile(itl, 50)),
        "itl_ms_p99": scaled(percentile(itl, 99)),
        "stream_tokens_per_s_p50": percentile(rates, 50),
        "stream_tokens_per_s_p5": percentile(rates, 5),
        "stalled_gaps_pct": 100.0 * sum(gap >= STALL_S for gap in itl) / len(itl) if itl else None,
        "output_tokens_per_s": sum(r.completion_tokens for r in ok) / span if span else None,
    }


COLUMNS = [
    ("long_ttft_ms_p50", "long TTFT p50 ms"),
    ("long_ttft_ms_p99", "long TTFT p99 ms"),
    ("stream_ttft_ms_p50", "stream TTFT p50 ms"),
    ("itl_ms_p99", "gap p99 ms"),
    ("stalled_gaps_pct", "gaps >= 90 ms %"),
    ("stream_tokens_per_s_p50", "per-stream tok/s p50"),
    ("stream_tokens_per_s_p5", "per-stream tok/s p5"),
    ("output_tokens_per_s", "output tok/s"),
    ("failed", "failed"),
]


def _cell(value: float | None, key: str) -> str:
    if value is None:
        return "-"
    return str(value) if isinstance(value, int) else f"{value:.{2 if key.endswith('pct') else 1}f}"


def table(results: dict[str, dict[str, Any]]) -> str:
    """A Markdown table, one row per layout."""
    head = "| layout | " + " | ".join(label for _, label in COLUMNS) + " |"
    rule = "|---|" + "---:|" * len(COLUMNS)
    rows = [f"| {name} | " + " | ".join(_cell(s[key], key) for key, _ in COLUMNS) + " |" for name, s in results.items()]
    return "\n".join([head, rule, *rows])


def save(path: Path, name: str, workload: Workload, records: list[Request], extra: dict[str, Any]) -> None:
    path.write_text(
        json.dumps(
            {"layout": name, "workload": asdict(workload), "summary": summary(records),
             "records": [asdict(r) for r in records], **extra},
            indent=1,
        )
    )  # fmt: skip


def load(path: Path) -> tuple[str, Workload, list[Request], dict[str, Any]]:
    """A saved run (``.json``, or ``.json.gz`` as docs/gpu-runs keeps them)."""
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    data = json.loads(raw)
    return data["layout"], Workload(**data["workload"]), [Request(**r) for r in data["records"]], data


def plot(runs: list[tuple[str, Workload, list[Request]]], png: Path) -> None:
    """ITL of the decode streams over time (long-prompt arrivals marked) and the long prompts'
    TTFT, per layout."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (over_time, ttft) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [2.2, 1]})
    colors = ["tab:blue", "tab:orange", "tab:green"]
    for (name, workload, records), color in zip(runs, colors, strict=False):
        xs: list[float] = []
        ys: list[float] = []
        for r in records:
            if r.kind == "stream":
                xs.extend(r.token_s[1:])
                ys.extend(gap * 1000 for gap in r.itl_s())
        over_time.scatter(xs, ys, s=2, alpha=0.35, color=color, label=f"{name}: stream ITL")
        longs = sorted((r.ttft_s or 0) * 1000 for r in records if r.kind == "long" and r.token_s)
        ttft.plot(longs, [(i + 1) / len(longs) for i in range(len(longs))], marker="o", color=color, label=name)
        for at in workload.long_arrivals():
            over_time.axvline(at, color="grey", lw=0.5, alpha=0.4)
    over_time.set(xlabel="seconds since start (grey: a long prompt arrives)", ylabel="inter-token latency, ms",
                  yscale="log", title="Decode streams while long prompts arrive")  # fmt: skip
    over_time.legend(markerscale=6)
    ttft.set(xlabel="time to first token, ms", ylabel="fraction of long prompts", title="Long prompts: TTFT CDF")
    ttft.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main(argv: list[str] | None = None) -> int:
    """Report on saved runs: ``python -m rehearsal.bench RUN.json... [--png FILE]``."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--png", type=Path)
    args = parser.parse_args(argv)
    loaded = [load(p) for p in args.runs]
    print(table({name: summary(records) for name, _, records, _ in loaded}))
    if args.png:
        plot([(name, workload, records) for name, workload, records, _ in loaded], args.png)
        print(f"picture: {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
