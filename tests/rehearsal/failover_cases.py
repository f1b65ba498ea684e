"""The failover's building blocks against Ray Serve itself (its router, ``choose_replica`` and
``dispatch``, real replicas that answer, refuse, hang or die), run by
tests/rehearsal/test_failover.py in the rehearsal's virtualenv: prints ``ok <case>`` for each.
The whole pair on real engines is the fault rehearsal's (``make rehearse-faults``)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "constructs/eks_pd_serving/fault_tolerance/failover"))

import eks_pd_failover as failover
import ray
from ray import serve
from ray.llm._internal.serve.core.configs.openai_api_models import ErrorInfo, ErrorResponse
from ray.serve.api import RunTarget


class EngineDeadError(RuntimeError):
    """vLLM's, by name (the failover tells availability by class name: Ray wraps it in RayTaskError)."""


# The first replica of the "one_of_two" app to start refuses (503); the other serves.
FIRST_REPLICA = Path(os.environ.get("TMPDIR", "/tmp")) / f"eks-pd-failover-cases-{os.getpid()}"
# Each call the "two_that_die" app's replicas take, a line.
DEATHS = Path(os.environ.get("TMPDIR", "/tmp")) / f"eks-pd-failover-deaths-{os.getpid()}"


@serve.deployment(max_ongoing_requests=8)
class Engine:
    """A stand-in engine with one behaviour, served by Serve's own replicas."""

    def __init__(self, behaviour: str) -> None:
        self.behaviour = behaviour
        if behaviour == "one_of_two":
            try:
                os.close(os.open(FIRST_REPLICA, os.O_CREAT | os.O_EXCL))
                self.behaviour = "503"
            except FileExistsError:
                self.behaviour = "ok"

    async def chat(self, request: str, raw: Any = None) -> Any:
        behaviour = self.behaviour
        if behaviour == "dies":
            os._exit(1)  # the replica's process, mid-request, before any chunk
        if behaviour == "two_that_die":
            with DEATHS.open("a") as calls:
                calls.write("called\n")
        if behaviour in ("raises", "two_that_die"):
            raise EngineDeadError("the engine died")
        if behaviour == "client_error":
            raise ValueError("Must setup lora config for multiplexed requests.")
        if behaviour == "hangs":
            await asyncio.sleep(60)
        if behaviour == "poisoned":  # decode's answer when prefill died serving this very request
            # failover.poisoned_refusal's shape (this class runs where that module is not importable)
            message = "the prefill engine died while serving this request; ..."
            yield ErrorResponse(error=ErrorInfo(message=message, type="PdEngineDied", code=503))
            return
        if behaviour in ("503", "400"):
            yield ErrorResponse(error=ErrorInfo(message=f"refused {behaviour}", type="X", code=int(behaviour)))
            return
        for chunk in (f"{request}:1", f"{request}:2", f"{request}:3"):
            yield chunk


def handle(app: str) -> Any:
    return serve.get_deployment_handle("Engine", app_name=app).options(stream=True).chat


async def collect(method: Any, wait_s: float = 2.0, first_s: float | None = None) -> list[Any]:
    return [chunk async for chunk in failover.attempt(method, ("q", None), wait_s, first_s)]


async def refused(method: Any, wait_s: float = 2.0, first_s: float | None = None) -> tuple[str, float]:
    started = time.monotonic()
    try:
        chunks = await collect(method, wait_s, first_s)
    except failover.Refused as error:
        return str(error), time.monotonic() - started
    raise AssertionError(f"not refused: {chunks}")


async def main() -> None:
    ok = handle("ok")
    assert await collect(ok) == ["q:1", "q:2", "q:3"]
    assert await collect(ok, first_s=5) == ["q:1", "q:2", "q:3"]
    print("ok a live replica's chunks stream through unchanged")

    reason, _ = await refused(handle("503"))
    assert reason.startswith("HTTP 503") and "refused 503" in reason
    (chunk,) = await collect(handle("400"))
    assert isinstance(chunk, ErrorResponse) and chunk.error.code == 400
    # The choice was released: the replica takes the next request at once.
    assert await asyncio.wait_for(collect(ok), 10) == ["q:1", "q:2", "q:3"]
    # The other phase's verdict on this one request is an answer, not this replica's unavailability:
    # passed through, so no breaker opens on a healthy decode (seen on the CPU: 3 requests refused).
    (chunk,) = await collect(handle("poisoned"))
    assert isinstance(chunk, ErrorResponse) and chunk.error.type == failover.POISONED_TYPE
    print("ok a server error before the first chunk is refused; a client error and a poisoned refusal pass through")

    reason, _ = await refused(handle("raises"))
    assert "EngineDeadError" in reason, reason
    try:
        await collect(handle("raises"))
    except failover.Refused as error:
        assert error.died, error  # its request may have killed it: replayed nowhere
    try:
        await collect(handle("503"))
    except failover.Refused as error:
        assert not error.died, error  # an answer, not a death: the other engine may take it
    reason, took = await refused(handle("hangs"), first_s=1.0)
    assert "no answer within 1 s" in reason and took < 3, (reason, took)
    print("ok an engine that raises, or answers later than first_s, is refused before any chunk")

    # No replica at all (it asks for a resource no node has): Serve's router holds the request.
    none = handle("none")
    reason, took = await refused(none, wait_s=1.0)
    assert reason == "no replica within 1 s" and 0.9 < took < 3, (reason, took)
    held = asyncio.ensure_future(none.remote("q", None).__anext__())
    await asyncio.sleep(5)
    assert not held.done()  # the control: the plain call is still held after 5 s
    held.cancel()
    print("ok no replica: refused after wait_s; the plain handle call is still held after 5 s (control)")

    reason, took = await refused(handle("dies"), wait_s=5.0)
    assert took < 30 and "no replica" not in reason, (reason, took)
    print(f"  the dead replica's refusal: {reason}")
    print("ok a replica that dies before its first chunk is refused")

    # Two replicas whose engines die on every request: the request that killed one is not offered
    # to the other (a request that kills one engine would kill them all).
    deaths = handle("two_that_die")
    try:
        await collect(deaths)
    except failover.Refused as error:
        assert error.died and error.replica is not None, error
    assert len(DEATHS.read_text().splitlines()) == 1, DEATHS.read_text()  # one replica saw it, not two
    assert failover.died(
        chunk=ErrorResponse(error=ErrorInfo(message="EngineCore encountered an issue.", type="X", code=500))
    )
    assert not failover.died(chunk=ErrorResponse(error=ErrorInfo(message="EngineDeadError", type="X", code=400)))
    print("ok a request whose dispatch ended in its engine's death is retried on no other replica")

    # A client's own error (here Ray's answer to an adapter id without adapters) is not the engine's:
    # it passes through as the error it is, and the next request is served as before.
    try:
        await collect(handle("client_error"))
    except failover.Refused as error:
        raise AssertionError(f"a client's error was taken for the engine's: {error}") from None
    except Exception as error:
        assert not failover.unavailable(error) and "Must setup lora config" in str(error), error
    else:
        raise AssertionError("the client's error vanished")
    print("ok a client's own error passes through as itself, not as the engine's unavailability")

    # Two replicas, one refusing: every request is served by the other, none refused.
    two = handle("one_of_two")
    for _ in range(40):  # the router picks one of two at random: a 1-in-16 slip would show here
        assert await collect(two) == ["q:1", "q:2", "q:3"]
    reason, took = await refused(handle("503"), wait_s=2.0)
    assert reason.startswith("HTTP 503") and took < 1.5, (reason, took)  # one replica: no wait for another
    print("ok a replica that refuses is left for another replica of its phase; with one, refused at once")

    now = [0.0]
    breaker = failover.Breaker("prefill", cooldown_s=5.0, clock=lambda: now[0])
    assert breaker.admit()
    breaker.failed("x")
    assert not breaker.admit()
    now[0] = 5.0
    assert breaker.admit() and not breaker.admit()  # one probe at a time
    breaker.failed("again")
    now[0] = 9.9
    assert not breaker.admit()
    now[0] = 10.0
    assert breaker.admit()
    breaker.released()  # the probe's client went away: another may probe
    assert breaker.admit()
    breaker.succeeded()
    assert breaker.admit() and breaker.admit()
    print("ok breaker: skipped for the cooldown, then one probe at a time, closed by a success")

    from ray.llm._internal.serve.core.configs.openai_api_models import ChatCompletionRequest, CompletionRequest

    def chat(*messages: tuple[str, str]) -> Any:
        return ChatCompletionRequest(model="m", messages=[{"role": r, "content": c} for r, c in messages])

    assert failover.prompt_chars(chat(("system", "  sys  "), ("user", "hello\n"), ("assistant", "x" * 999))) == 1007
    # An assistant's text counts from its last reasoning block's end (templates drop what precedes).
    assert failover.prompt_chars(chat(("assistant", "r" * 500 + "</think> answer"))) == 6
    assert failover.too_long(chat(("user", "a" * 100)), 100) is None  # fits: never refused at the bound
    refusal = failover.too_long(chat(("user", "a" * 101)), 100)
    assert refusal is not None and refusal.error.code == 400 and refusal.error.param == "messages"
    assert failover.too_long(CompletionRequest(model="m", prompt="b" * 101), 100).error.param == "prompt"
    assert failover.too_long(chat(("user", "a" * 10**6)), None) is None  # no bound known: the engine decides
    print("ok a prompt past max_model_len at the longest token is 400 before any tokenizer; one within is not")

    # Every string a template renders counts; so do token ids and the number of messages.
    assistant = ChatCompletionRequest(model="m", messages=[{"role": "assistant", "content": "a" * 2000}])
    assert failover.too_long(assistant, 1000).error.param == "messages"
    tool = {"type": "function", "function": {"name": "f", "description": "d" * 2000, "parameters": {}}}
    assert failover.too_long(
        ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], tools=[tool]), 1000
    )
    calls = [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "x" * 2000}}]
    assert failover.too_long(
        ChatCompletionRequest(model="m", messages=[{"role": "assistant", "tool_calls": calls}]), 1000
    )
    thinking = ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "hi"}], chat_template_kwargs={"enable_thinking": "y" * 2000}
    )
    assert failover.too_long(thinking, 1000)
    ids = CompletionRequest(model="m", prompt=list(range(4097)))
    assert "4097 token ids" in failover.too_long(ids, None, 4096).error.message
    assert failover.too_long(CompletionRequest(model="m", prompt=list(range(4096))), None, 4096) is None
    many = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": ""}] * 9)
    assert "9 messages" in failover.too_long(many, None, 8).error.message
    print("ok every role, tool call, tool schema and template option counts; token ids and messages by number")

    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert failover.request_refusal(body, "chat") is None
    for extra, param in (
        ({"vllm_xargs": {"kv_transfer_params": ""}}, "vllm_xargs.kv_transfer_params"),
        ({"vllm_xargs": {"ec_transfer_params": []}}, "vllm_xargs.ec_transfer_params"),
        ({"kv_transfer_params": {}}, "kv_transfer_params"),
        ({"chat_template": "{{ x }}"}, "chat_template"),
        ({"chat_template_kwargs": {"chat_template": "{{ x }}"}}, "chat_template_kwargs.chat_template"),
        ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs.tokenize"),
        ({"chat_template_kwargs": {"enable_thinking": {"nested": 1}}}, "chat_template_kwargs.enable_thinking"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "a", "extra": 1}]}]},
            "messages[0].content[0].extra",
        ),
        ({"request_id": "another-clients-id"}, "request_id"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}] * 129}, "tools"),
    ):
        refusal = failover.request_refusal({**body, **extra}, "chat")
        assert refusal is not None and refusal.error.code == 400 and refusal.error.param == param, (extra, refusal)
    assert failover.request_refusal({**body, "chat_template": "{{ x }}"}, "chat", trust_templates=True) is None
    completion = {"model": "m", "prompt": [[1, 2], [3]], "max_tokens": 4}
    assert failover.request_refusal(completion, "completions") is None
    assert failover.request_refusal({**completion, "prompt_embeds": "x"}, "completions").error.param == "prompt_embeds"
    # Every field on the allowlist is one vLLM's request models have (else a listed field would be dropped).
    assert set(failover.REQUEST_SHAPES["chat"]) <= set(ChatCompletionRequest.model_fields)
    assert set(failover.REQUEST_SHAPES["completions"]) <= set(CompletionRequest.model_fields)
    print("ok a request is read through an allowlist at every depth: anything else is 400 naming it")

    request = CompletionRequest(
        model="m", prompt="p", kv_transfer_params={"a": 1}, vllm_xargs={"kv_transfer_params": "", "x": 1}
    )
    failover.scrub(request)
    assert (request.kv_transfer_params, request.vllm_xargs) == (None, None)
    request = CompletionRequest(
        model="m", prompt="p", kv_transfer_params={"do_remote_decode": True}, vllm_xargs={"kv_transfer_params": ""}
    )
    failover.scrub(request, keep_transfer=True)  # decode's own, on prefill's side
    assert (request.kv_transfer_params, request.vllm_xargs) == ({"do_remote_decode": True}, None)
    now = [0.0]
    poisoned = failover.Poisoned(cooldown_s=5.0, clock=lambda: now[0], shared=False)
    poisoned.add(request)
    same = CompletionRequest(model="m", prompt="p", kv_transfer_params={"do_remote_decode": True}, stream=True)
    assert await poisoned.holds(same) and not await poisoned.holds(CompletionRequest(model="m", prompt="q"))
    now[0] = 5.0
    assert not await poisoned.holds(same)  # for the cooldown only
    # Another replica (another process's record) learns it from the store they share.
    here, there = failover.Poisoned(cooldown_s=5.0), failover.Poisoned(cooldown_s=5.0)
    here.add(same)
    deadline = time.monotonic() + 10
    while not await there.holds(same) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert await there.holds(same) and not await there.holds(CompletionRequest(model="m", prompt="q"))
    assert failover.poisoned_refusal("decode").error.code == 503
    print("ok engines clear the orchestrator's fields on every path; its body is refused for the cooldown")

    for bad in (None, {"wait_s": 0, "prefill_timeout_s": 1}, {"wait_s": 1, "prefill_timeout_s": 1, "x": 1}):
        try:
            failover.Failover.parse(bad)
        except ValueError as error:
            assert failover.ARGS_KEY in str(error)
        else:
            raise AssertionError(f"accepted {bad}")
    import vllm

    failover.check_versions([[ray.__version__, vllm.__version__]])
    failover.check_versions([])  # no record handed on: not checked
    try:
        failover.check_versions([["2.58.0", "0.26.0"]])
    except RuntimeError as error:
        assert f"Ray {ray.__version__} + vLLM {vllm.__version__}" in str(error) and "\n" not in str(error), error
    else:
        raise AssertionError("a pair the record does not cover started")
    print("ok the builder's args are checked; an engine refuses to start on a Ray and vLLM the record does not cover")

    # Another application's deployment by name, before that application exists (the phases start in
    # any order): refused within wait_s, neither a KeyError nor a hold; once it runs, the same
    # handle serves.
    later = failover.other_phase({"app": "later", "deployment": "Engine"}).options(stream=True).chat
    reason, took = await refused(later, wait_s=1.0)
    assert "no replica within 1 s" in reason and took < 3, (reason, took)
    later_app = RunTarget(Engine.bind("ok"), name="later", route_prefix=None)  # type: ignore[attr-defined]
    await asyncio.to_thread(serve.run_many, [later_app])
    assert await asyncio.wait_for(collect(later), 30) == ["q:1", "q:2", "q:3"]
    print("ok another application by name: refused within wait_s before it exists, served once it runs")

    ran: list[str] = []

    class Callback:
        async def on_engine_started(self) -> None:
            ran.append("shared")

    class Config:
        def __init__(self, callback: Any) -> None:
            self.callback = callback

        def get_or_create_callback(self) -> Any:
            if isinstance(self.callback, Exception):
                raise self.callback
            return self.callback

    server = object.__new__(failover.FailoverDecodeServer)
    for callback, started in ((Callback(), True), (object(), False), (RuntimeError("no placement group"), False)):
        server._llm_config = Config(callback)
        task = failover.engine_started(server)
        assert (task is not None) == started, callback
        if task is not None:
            await task
    assert ran == ["shared"]
    print("ok the callback's after-start hook runs in the background; none, or a failing lookup, fails nothing")

    prefill = object.__new__(failover.FailoverPrefillServer)
    prefill._pair, prefill._unpaired_seen = "aaaa", set()
    assert prefill._unpaired(None) is None and prefill._unpaired("aaaa") is None
    (chunk,) = [c async for c in prefill._unpaired("bbbb")]
    assert chunk.error.code == 503 and chunk.error.type == failover.PAIR_MISMATCH_TYPE, chunk
    assert failover.retryable(chunk) is not None  # decode's attempt refuses it: it prefills locally
    print("ok prefill refuses a decode of another pair key with a 503 before its engine")


if __name__ == "__main__":
    ray.init(num_cpus=16, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": 0})
        targets = [
            RunTarget(Engine.bind(b), name=b, route_prefix=None)  # type: ignore[attr-defined]
            for b in ("ok", "503", "400", "poisoned", "raises", "hangs", "dies", "client_error")
        ]
        two = Engine.options(num_replicas=2)  # type: ignore[attr-defined]
        targets.append(RunTarget(two.bind("one_of_two"), name="one_of_two", route_prefix=None))
        targets.append(RunTarget(two.bind("two_that_die"), name="two_that_die", route_prefix=None))
        serve.run_many(targets)
        no_node = {"num_cpus": 0, "resources": {"no-such-node": 1}}
        unplaceable = Engine.options(ray_actor_options=no_node)  # type: ignore[attr-defined]
        serve.run_many(
            [RunTarget(unplaceable.bind("none"), name="none", route_prefix=None)], wait_for_applications_running=False
        )
        asyncio.run(main())
    finally:
        serve.shutdown()
        ray.shutdown()
