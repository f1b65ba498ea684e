"""One vLLM engine with the given engine kwargs, started, asked for a few tokens, stopped.

    python -m rehearsal.gpu_engine '<engine kwargs as JSON>' [--decode]

Run by `rehearsal.gpu emulate` in its own process (one per GPU) so that vLLM's profiler log
(which it parses) is this engine's alone. With ``--decode``, it also times greedy decode of
128 tokens a stream (``ignore_eos``, 16-token prompts) at batch 1 and at ``max_num_seqs``
streams, three runs each after a warm-up, and prints the median tokens/s.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

DECODE_TOKENS = 128
DECODE_RUNS = 3


def _decode_rate(llm: object, batch: int) -> tuple[float, float]:
    """(median output tokens/s of the batch, per stream) over DECODE_RUNS timed runs."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=DECODE_TOKENS, ignore_eos=True, temperature=0.0)
    prompts = [f"Stream {i}: the quick brown fox jumps over the lazy dog" for i in range(batch)]
    llm.generate(prompts, params, use_tqdm=False)  # type: ignore[attr-defined]  # warm-up
    rates = []
    for _ in range(DECODE_RUNS):
        started = time.monotonic()
        outputs = llm.generate(prompts, params, use_tqdm=False)  # type: ignore[attr-defined]
        elapsed = time.monotonic() - started
        rates.append(sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed)
    median = statistics.median(rates)
    return median, median / batch


def main(argv: list[str]) -> int:
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    kwargs = json.loads(argv[0])
    if "kv_transfer_config" in kwargs:
        kwargs["kv_transfer_config"] = KVTransferConfig(**kwargs["kv_transfer_config"])
    started = time.monotonic()
    llm = LLM(**kwargs)
    print(f"STARTUP_S {time.monotonic() - started:.1f}", flush=True)
    outputs = llm.generate(["The quick brown fox"] * 4, SamplingParams(max_tokens=8, ignore_eos=True))
    print(f"GENERATED_TOKENS {[len(o.outputs[0].token_ids) for o in outputs]}", flush=True)
    if "--decode" in argv[1:]:
        for batch in sorted({1, int(kwargs.get("max_num_seqs", 1))}):
            total, per_stream = _decode_rate(llm, batch)
            print(f"DECODE batch={batch} tokens_per_s={total:.1f} per_stream={per_stream:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
