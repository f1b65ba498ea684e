"""A standby engine's two costs, measured with the 9B's size on the device machine: what an asleep
vLLM engine still holds on the GPU, and how long it takes to wake and answer again.

usage: python3 sleep_wake.py DIR CACHE OUT.json [--nixl]
One engine in a fresh process, the default template's engine settings at an L4's memory budget
(start-split/cold_start.py's ENGINE), vLLM's sleep mode on: greedy answer, sleep(level=1) (weights to
host memory, KV cache dropped), wake_up(), the same answer again; each step timed, the GPU's free
memory read around each. --nixl adds the template's NixlConnector (kv_both, UCX) to see whether
sleep and wake run with the connector's KV registration."""
import json, os, subprocess, sys, time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "start-split"))
from cold_start import ENGINE, L4_GIB  # noqa: E402

CHILD = r"""
import json, os, sys, time
import torch
from vllm import LLM, SamplingParams
kw = json.loads(sys.argv[2])
total = torch.cuda.get_device_properties(0).total_memory
kw["gpu_memory_utilization"] = round(0.9 * %r * 2**30 / total, 4)
def free_gib():
    return round(torch.cuda.mem_get_info()[0] / 2**30, 2)
def host_available_gib():
    line = next(l for l in open("/proc/meminfo") if l.startswith("MemAvailable"))
    return round(int(line.split()[1]) / 2**20, 2)
r = {"gpu_total_gib": round(total / 2**30, 2), "gpu_memory_utilization": kw["gpu_memory_utilization"]}
t = time.time(); llm = LLM(model=sys.argv[1], enable_sleep_mode=True, **kw); r["start_s"] = round(time.time() - t, 2)
sp = SamplingParams(max_tokens=16, temperature=0)
prompt = ["The capital of France is"]
before = llm.generate(prompt, sp)[0].outputs[0].token_ids
r["free_awake_gib"] = free_gib(); r["host_available_awake_gib"] = host_available_gib()
t = time.time(); llm.sleep(level=1); r["sleep_s"] = round(time.time() - t, 2)
r["free_asleep_gib"] = free_gib(); r["host_available_asleep_gib"] = host_available_gib()
t = time.time(); llm.wake_up(); r["wake_s"] = round(time.time() - t, 2)
r["free_woken_gib"] = free_gib()
t = time.time(); after = llm.generate(prompt, sp)[0].outputs[0].token_ids; r["first_answer_after_wake_s"] = round(time.time() - t, 2)
r["same_answer"] = list(before) == list(after)
print("RESULT " + json.dumps(r), flush=True)
""" % L4_GIB

NIXL = {"kv_connector": "NixlConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {"backends": ["UCX"]}, "kv_buffer_device": "cuda"}


def main(d, cache, out, nixl):
    import re
    engine = dict(ENGINE, **({"kv_transfer_config": NIXL} if nixl else {}))
    env = dict(os.environ, VLLM_CACHE_ROOT=f"{cache}/vllm", TRITON_CACHE_DIR=f"{cache}/triton",
               TORCHINDUCTOR_CACHE_DIR=f"{cache}/inductor", VLLM_USE_FLASHINFER_SAMPLER="0",
               VLLM_NO_USAGE_STATS="1", PYTHONUNBUFFERED="1", UCX_TLS="tcp,cuda_copy")
    t = time.time()
    p = subprocess.run([sys.executable, "-c", CHILD, d, json.dumps(engine)], env=env, capture_output=True,
                       text=True, timeout=int(os.environ.get("CHILD_TIMEOUT", "300")))
    log = p.stdout + p.stderr
    open(out.replace(".json", ".log"), "w").write(log)
    r = {"rc": p.returncode, "wall_s": round(time.time() - t, 2), "nixl": nixl}
    m = re.search(r"RESULT (\{.*\})", log)
    if m:
        r.update(json.loads(m.group(1)))
    for key, pat in {"sleep_freed": r"Sleep mode freed ([\d.]+) GiB memory, ([\d.]+) GiB memory is still in use",
                     "kv_tokens": r"GPU KV cache size: ([\d,]+) tokens"}.items():
        hits = re.findall(pat, log)
        if hits:
            r[key] = hits[-1]
    json.dump(r, open(out, "w"), indent=1)
    print(json.dumps(r))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], "--nixl" in sys.argv)
