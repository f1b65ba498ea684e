"""One vLLM engine with the given engine kwargs, started, asked for a few tokens, stopped.

    python -m rehearsal.gpu_engine '<engine kwargs as JSON>'

Run by `rehearsal.gpu emulate` in its own process (one per GPU) so that vLLM's profiler log
(which it parses) is this engine's alone.
"""

from __future__ import annotations

import json
import sys
import time


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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
