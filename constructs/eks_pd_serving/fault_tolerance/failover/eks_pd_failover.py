"""The PD pair's failover (pod-side): no request fails for one engine's fault.

Ray Serve LLM 2.58's ``build_pd_openai_app`` is ingress -> ``PDDecodeServer`` -> ``PDPrefillServer``
in one Serve application and always prefills remotely: a dead prefill fails or holds every request,
a dead decode holds them all (Serve's router waits for a replica as long as there is none), and a
change of either engine restarts both. Yet both engines are full vLLM engines of one model.
``build_prefill_app``, ``build_decode_app`` and ``build_ingress_app`` compose the same public pieces
(``build_llm_deployment``, ``PDDecodeServer``/``PDPrefillServer``, ``OpenAiIngress``) into the same
OpenAI surface, with the same deployment names, each phase a Serve application of its own and the
ingress a third (``IMPORT_PATHS``), each reaching the others by application and deployment name at
its first call (``other_phase``: any start order), plus:

- a phase's application restarts alone when its engine changes; prefill refuses (503, before its
  engine) a decode whose ``pair`` (the digest of what their KV must agree on) is not its own, so
  engines of different weights or KV layouts are never paired while one phase is updated before
  the other;
- the failover's settings are the decode and ingress deployments' ``user_config``
  (``reconfigure``): a change restarts nothing;

- decode prefills locally when prefill has no replica within ``wait_s``, fails, or does not
  answer within ``prefill_timeout_s`` (nothing was generated: the request starts again there);
- the ingress sends a request whole to the prefill engine (colocated, no KV transfer) when decode
  has no replica within ``wait_s`` or refuses it before its first chunk (the KV guard's 503, an
  engine dead before streaming, a replica that died): nothing was sent, so the retry is safe;
- neither can serve: HTTP 503 with ``Retry-After`` at once; no request waits for replicas longer
  than ``wait_s`` for each of the two engines;
- prompts of at most ``short_prompt_tokens`` tokens are served on decode alone (conditional disaggregation:
  the transfer costs more than it saves);
- a phase that failed is skipped for ``COOLDOWN_S``; then one request probes it while the others
  keep the fallback, and its success brings the pair back to disaggregated serving by itself.

What a client may send is what Ray's own builder lets through, and less:

- ``kv_transfer_params`` and ``ec_transfer_params`` are the orchestrator's to set (Ray's asserts
  they are empty; vLLM acts on them: a KV pull from any host they name). The ingress answers 400
  to a request that carries them, and decode clears them again before any of its paths;
- ``<model>:<adapter>`` is 404 when the model has no adapters (Ray would send it to the engines);
- a prompt longer than ``max_model_len`` could hold at the tokenizer's longest token is 400 before
  anything tokenizes it, and the short-prompt count runs off the event loop, over what the chat
  template renders (tools and template options included);
- a breaker opens only on availability (``unavailable``: no replica within ``wait_s``, a dead or
  unavailable replica, actor or engine, a 5xx first chunk); any other error is that client's own,
  answered with its own status, and a probe is released on every exit. A replica that fails is
  left for another replica of the same phase before the other engine is used.

Each request is counted once (``METRIC``, tag ``path``: one of ``PATHS``), on the path whose engine
answered its first chunk, on Ray's metrics endpoint; a client's error is no path. It imports nothing
of the package.

It overrides Ray's ``_pd_handle_request`` (decode), ``_get_response`` and ``_process_llm_request``
(ingress), and calls a few of their private helpers: the package records a digest of each such
upstream definition per Ray version (``upstream.py``, not shipped: re-recording rebuilds nothing), a
test fails when the installed Ray's differ, and each engine replica refuses to start on a Ray and
vLLM pair the record does not cover (``check_versions``, the phases' ``covered`` args).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import sys
import time
from collections.abc import AsyncGenerator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ray import serve

# Not public in Ray 2.58: PDServingArgs (the builder's args), the request and error models the
# ingress itself parses into (the public ones are subclasses: isinstance would miss Ray's own),
# RawRequestInfo and the config defaults the builder applies.
from ray.llm._internal.serve.core.configs.openai_api_models import (
    ChatCompletionRequest,
    CompletionRequest,
    ErrorInfo,
    ErrorResponse,
    OpenAIHTTPException,
    to_model_metadata,
)
from ray.llm._internal.serve.core.protocol import RawRequestInfo

# Public where Ray 2.58 makes them public (ray.serve.llm and its submodules).
from ray.serve.llm import LLMConfig, build_llm_deployment
from ray.serve.llm.deployment import LLMServer, PDDecodeServer, PDPrefillServer
from ray.serve.llm.ingress import OpenAiIngress, make_fastapi_ingress
from starlette.responses import JSONResponse, Response

# One Serve application per phase of each model, and one ingress application on ``/`` for all of
# them: each phase restarts alone when its own args change. Their builders, by role.
IMPORT_PATHS = {
    "prefill": "eks_pd_failover:build_prefill_app",
    "decode": "eks_pd_failover:build_decode_app",
    "ingress": "eks_pd_failover:build_ingress_app",
}
# The failover's settings: the ``user_config`` of decode's and the ingress's deployments (Serve
# hands a change to ``reconfigure``, restarting no replica); named so in errors.
ARGS_KEY = "failover"
# A phase's args: ``llm_config`` (Ray's LLMConfig) and ``pair``, the digest of what its KV must
# agree on with the other phase's (model, weights, dtype, KV transfer); decode's also ``prefill``
# (``{"app": ..., "deployment": ...}``). The ingress's: ``models``, one ``{"model_id",
# "max_model_len", "adapters", "decode", "prefill", "trust_request_chat_template"}`` each.
INGRESS_MODEL_KEYS = ("model_id", "max_model_len", "adapters", "decode", "prefill", "trust_request_chat_template")
PAIR_MISMATCH_TYPE = "PdPairMismatch"
METRIC = "eks_pd_requests_by_path"
INGRESS_NAME = "OpenAiIngress"
# disaggregated: remote prefill, then decode. short_prompt: on decode alone, by the threshold.
# local_prefill: prefill could not serve, decode prefilled itself. prefill_whole: decode could
# not serve, the prefill engine served it whole. refused: neither could (HTTP 503).
PATHS = ("disaggregated", "short_prompt", "local_prefill", "prefill_whole", "refused")
# How long a phase that failed is skipped before one request probes it again; also the 503's
# Retry-After.
COOLDOWN_S = 5.0
FALLBACK_LINE = "PD failover"
RECOVERED_LINE = "PD failover: back to"
# The refusal's error type, which only this module sets: the ingress adds Retry-After to it alone.
REFUSED_TYPE = "PdPairUnavailable"
REFUSAL = "neither the decode nor the prefill engine can serve now; nothing was generated. Retry after {} s."

# The orchestrator's fields, never a client's (Ray 2.58 asserts the first is empty before any
# engine sees a request: engines/vllm/kv_transfer/base.py). vLLM also reads them from a request's
# ``vllm_xargs`` (copied into ``SamplingParams.extra_args``, read by the engine core): a non-dict
# there kills the engine core's busy loop.
ORCHESTRATOR_FIELDS = ("kv_transfer_params", "ec_transfer_params")

# What a client may send, read through an allowlist at every depth: a field (or a key inside one)
# that is not below is refused with 400 and its path as ``param``, before any engine or tokenizer
# reads it. SCALAR: a JSON string, number, boolean or null; ANY: any JSON (a schema the client
# writes, rendered into the prompt and counted by the bound, never read as engine state); a dict:
# those keys, each of its shape; a one-item list: a list of that shape; a tuple: one of those shapes,
# chosen by the value's JSON type.
SCALAR = "scalar"
ANY = "any"
_TEXT_PART = {"type": SCALAR, "text": SCALAR}
_MEDIA_PARTS = {
    "image_url": {"url": SCALAR, "detail": SCALAR},
    "input_audio": {"data": SCALAR, "format": SCALAR},
    "video_url": {"url": SCALAR},
}
_PART = {**_TEXT_PART, **_MEDIA_PARTS}
_CONTENT = (SCALAR, [_PART])
_FUNCTION_CALL = {"name": SCALAR, "arguments": SCALAR}
_MESSAGE = {
    "role": SCALAR,
    "content": _CONTENT,
    "name": SCALAR,
    "tool_calls": [{"id": SCALAR, "type": SCALAR, "function": _FUNCTION_CALL}],
    "tool_call_id": SCALAR,
    "reasoning_content": SCALAR,
    "reasoning": SCALAR,
    "refusal": SCALAR,
}
_TOOL = {"type": SCALAR, "function": {"name": SCALAR, "description": SCALAR, "parameters": ANY, "strict": SCALAR}}
# The keys of ``vllm_xargs`` a client may set: nothing in this deployment reads one, so none.
VLLM_XARGS: tuple[str, ...] = ()
# The chat template's own switches a client may set (``chat_template_kwargs``), scalars only. A
# request's ``chat_template`` (top level or here) is client code run by the tokenizer: refused
# unless the ingress's ``trust_request_chat_template`` (vLLM's own default refuses it too).
TEMPLATE_KWARGS = ("enable_thinking", "thinking", "reasoning_effort", "add_vision_id")
_SAMPLING = {
    "model": SCALAR,
    "frequency_penalty": SCALAR,
    "presence_penalty": SCALAR,
    "repetition_penalty": SCALAR,
    "logit_bias": ANY,
    "logprobs": SCALAR,
    "max_tokens": SCALAR,
    "min_tokens": SCALAR,
    "n": SCALAR,
    "seed": SCALAR,
    "stop": (SCALAR, [SCALAR]),
    "stop_token_ids": [SCALAR],
    "include_stop_str_in_output": SCALAR,
    "ignore_eos": SCALAR,
    "stream": SCALAR,
    "stream_options": {"include_usage": SCALAR, "continuous_usage_stats": SCALAR},
    "temperature": SCALAR,
    "top_p": SCALAR,
    "top_k": SCALAR,
    "min_p": SCALAR,
    "user": SCALAR,
    "skip_special_tokens": SCALAR,
    "spaces_between_special_tokens": SCALAR,
    "add_special_tokens": SCALAR,
    "truncate_prompt_tokens": SCALAR,
    "allowed_token_ids": [SCALAR],
    "bad_words": [SCALAR],
    "echo": SCALAR,
    "return_tokens_as_token_ids": SCALAR,
    "return_token_ids": SCALAR,
    "response_format": {
        "type": SCALAR,
        "json_schema": {"name": SCALAR, "description": SCALAR, "schema": ANY, "strict": SCALAR},
    },
    "vllm_xargs": {key: SCALAR for key in VLLM_XARGS},
}
REQUEST_SHAPES: dict[str, dict[str, Any]] = {
    "chat": {
        **_SAMPLING,
        "messages": [_MESSAGE],
        "max_completion_tokens": SCALAR,
        "top_logprobs": SCALAR,
        "tools": [_TOOL],
        "tool_choice": (SCALAR, {"type": SCALAR, "function": {"name": SCALAR}}),
        "parallel_tool_calls": SCALAR,
        "reasoning_effort": SCALAR,
        "include_reasoning": SCALAR,
        "add_generation_prompt": SCALAR,
        "continue_final_message": SCALAR,
        "documents": [{"title": SCALAR, "text": SCALAR}],
        "chat_template_kwargs": {key: SCALAR for key in TEMPLATE_KWARGS},
    },
    "completions": {
        **_SAMPLING,
        "prompt": (SCALAR, [(SCALAR, [SCALAR])]),
        "suffix": SCALAR,
    },
}
# What a trusted request template adds (``trust_request_chat_template``).
_TRUSTED_TEMPLATE = {"chat_template": SCALAR}
# OpenAI's own cap on a request's tools.
MAX_TOOLS = 128
# The short-prompt count's own threads (a template render can be slow; a thread cannot be
# cancelled): at most this many at once, each awaited at most COUNT_TIMEOUT_S, after which the
# request takes the standard path and the count's result is dropped.
COUNT_THREADS = 2
COUNT_TIMEOUT_S = 0.5
# What says a replica, its actor or its engine is gone, by class name anywhere in the exception's
# MRO (Ray hands a replica's exception on as ``RayTaskError(<its class>)``, a subclass of both).
UNAVAILABLE = frozenset(
    {
        "RayActorError",
        "ActorDiedError",
        "ActorUnavailableError",
        "DeploymentUnavailableError",
        "ReplicaUnavailableError",
        "BackPressureError",
        "EngineDeadError",
    }
)
# What says an engine or its replica's actor died while serving a request (by class name in an
# exception's MRO, or named in a 5xx first chunk): that request may have killed it, so it is
# replayed on no other replica and no other phase (``Poisoned``), and gets POISONED_TYPE's 503.
DIED = frozenset({"EngineDeadError", "ActorDiedError"})
DIED_TEXTS = ("EngineCore encountered an issue",)
POISONED_TYPE = "PdEngineDied"
# A replica whose engine was already dead when a request came: unavailable before it, so the other
# phase may serve it (the ingress and decode fail over on this 503).
ENGINE_DOWN_TYPE = "PdEngineDown"
ENGINE_DOWN = "this replica's engine is down; the request was not started here."
POISONED = (
    "the {phase} engine died while serving this request; it is not sent to the other engine, which "
    "refuses the same request for {after} s. Nothing was generated."
)
# At most this many poisoned bodies are remembered at once (each for COOLDOWN_S), in each replica
# and in the actor they share (named so in the namespace so), asked within POISONED_ASK_S.
POISONED_KEPT = 1024
POISONED_ACTOR = "eks-pd-poisoned-requests"
POISONED_NAMESPACE = "eks-pd"
POISONED_ASK_S = 0.5
# How many replicas of one phase a request tries before the other engine, and how long it waits
# for the router to choose another one (a phase of one replica answers at once: only the failed one).
REPLICAS_TRIED = 2
OTHER_REPLICA_WAIT_S = 0.25
CHOICES_PER_TRY = 4
logger = logging.getLogger("ray.serve")
COUNTS = ThreadPoolExecutor(max_workers=COUNT_THREADS, thread_name_prefix="eks-pd-count")


@dataclass(frozen=True)
class Failover:
    """The serve config's ``failover`` args. ``wait_s``: the longest a request waits for a replica
    of one engine; ``prefill_timeout_s``: for prefill's answer once dispatched; ``short_prompt_tokens``:
    prompts of at most this many tokens skip the transfer (0: none do)."""

    wait_s: float
    prefill_timeout_s: float
    short_prompt_tokens: int = 0

    @classmethod
    def parse(cls, value: Any) -> Failover:
        if not isinstance(value, dict):
            raise ValueError(f"{ARGS_KEY}: expected a mapping, got {value!r}")
        unknown = sorted(set(value) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"{ARGS_KEY}: unknown keys {unknown}")
        failover = cls(**value)
        if failover.wait_s <= 0 or failover.prefill_timeout_s <= 0 or failover.short_prompt_tokens < 0:
            raise ValueError(f"{ARGS_KEY}: wait_s and prefill_timeout_s must be positive, short_prompt_tokens >= 0")
        return failover

    def as_args(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


# Until ``reconfigure`` brings the deployment's own (Serve calls it before the replica serves).
DEFAULT_FAILOVER = Failover(wait_s=2.0, prefill_timeout_s=30.0, short_prompt_tokens=0)


class Refused(Exception):
    """An engine did not take the request before its first chunk: nothing was sent to the client.
    ``replica``: the replica that failed it (None: no replica was chosen). ``died``: the dispatch
    ended in its engine's or actor's death (``died``), which the request may have caused: it is
    replayed nowhere."""

    def __init__(self, reason: str, replica: str | None = None, died: bool = False) -> None:
        super().__init__(reason)
        self.replica = replica
        self.died = died


class Poisoned:
    """Bodies whose dispatch ended in an engine's death, by digest, each kept ``cooldown_s``: the other
    phase refuses them meanwhile, so one request never takes down both engines. Held here and in one
    small Ray actor all replicas share (``POISONED_ACTOR``): a client's retry may reach another
    ingress or decode replica. The shared store is asked only before a request is replayed on the
    other phase, within ``POISONED_ASK_S``; unreachable, it is not consulted (the local record holds)."""

    def __init__(self, cooldown_s: float = COOLDOWN_S, clock: Any = time.monotonic, shared: bool = True) -> None:
        self.cooldown_s, self.clock, self.shared = cooldown_s, clock, shared
        self._until: dict[str, float] = {}
        self._store: Any = None

    @staticmethod
    def digest(request: Any) -> str:
        try:
            text = request.model_dump_json(exclude={"stream", "stream_options", "request_id"})
        except Exception:
            text = repr(request)
        return hashlib.sha256(text.encode()).hexdigest()

    def _shared_store(self) -> Any:
        if self._store is None and self.shared:
            import ray

            store = ray.remote(_store_class()).options(
                name=POISONED_ACTOR, namespace=POISONED_NAMESPACE, get_if_exists=True, lifetime="detached",
                num_cpus=0, max_restarts=-1,
            )  # fmt: skip
            self._store = store.remote(POISONED_KEPT)
        return self._store

    def warm(self) -> None:
        """Create (or find) the shared store now, at the replica's start, so the first ask finds it running."""
        try:
            self._shared_store()
        except Exception as error:
            logger.warning("%s: the poisoned-request store is not reachable yet: %s", FALLBACK_LINE, error)

    def add(self, request: Any) -> None:
        now, digest = self.clock(), self.digest(request)
        self._until = {k: t for k, t in self._until.items() if t > now}
        if len(self._until) < POISONED_KEPT:
            self._until[digest] = now + self.cooldown_s
        try:
            store = self._shared_store()
            if store is not None:
                store.add.remote(digest, self.cooldown_s)
        except Exception as error:  # the local record still holds
            logger.warning("%s: poisoned request not shared: %s", FALLBACK_LINE, error)

    def died_serving(self, request: Any, phase: str) -> ErrorResponse:
        """``request``'s dispatch ended in ``phase``'s engine dying: recorded here and shared, and the
        503 it gets instead of a replay."""
        self.add(request)
        logger.warning("%s: the %s engine died serving a request; not replayed", FALLBACK_LINE, phase)
        return poisoned_refusal(phase)

    async def holds(self, request: Any) -> bool:
        digest = self.digest(request)
        if self._until.get(digest, 0.0) > self.clock():
            return True
        try:
            store = self._shared_store()
            if store is None:
                return False
            return bool(await asyncio.wait_for(store.holds.remote(digest), POISONED_ASK_S))
        except Exception:
            return False


def _store_class() -> type:
    """The poisoned digests every replica shares (a Ray actor, ``Poisoned``), each until the actor's
    own clock's deadline. Made in a function so that Ray ships the class by value: its worker then
    imports nothing of this module (which imports vLLM, seconds of a start)."""

    class PoisonedStore:
        def __init__(self, kept: int) -> None:
            self.kept = kept
            self.until: dict[str, float] = {}

        def add(self, digest: str, cooldown_s: float) -> None:
            import time as clock

            now = clock.monotonic()
            self.until = {k: t for k, t in self.until.items() if t > now}
            if len(self.until) < self.kept:
                self.until[digest] = now + cooldown_s

        def holds(self, digest: str) -> bool:
            import time as clock

            return self.until.get(digest, 0.0) > clock.monotonic()

    return PoisonedStore


def poisoned_refusal(phase: str) -> ErrorResponse:
    """The 503 of a request whose dispatch ended in ``phase``'s engine dying: it is not replayed."""
    message = POISONED.format(phase=phase, after=int(COOLDOWN_S))
    return ErrorResponse(error=ErrorInfo(message=message, type=POISONED_TYPE, code=503))


class Breaker:
    """One phase as this process last saw it. Closed: try it. After a failure: skipped for
    ``cooldown_s``; then one request at a time probes it until one succeeds."""

    def __init__(self, phase: str, cooldown_s: float = COOLDOWN_S, clock: Any = time.monotonic) -> None:
        self.phase, self.cooldown_s, self.clock = phase, cooldown_s, clock
        self.open_until: float | None = None
        self.probing = False

    def admit(self) -> bool:
        """Whether this request should try the phase (a probe, when it failed before)."""
        if self.open_until is None:
            return True
        if self.probing or self.clock() < self.open_until:
            return False
        self.probing = True
        return True

    def succeeded(self) -> None:
        if self.open_until is not None:
            logger.warning("%s %s", RECOVERED_LINE, f"the {self.phase} engine")
        self.open_until, self.probing = None, False

    def failed(self, reason: str) -> None:
        if self.open_until is None:
            logger.warning("%s: %s engine skipped for %.0f s: %s", FALLBACK_LINE, self.phase, self.cooldown_s, reason)
        self.open_until, self.probing = self.clock() + self.cooldown_s, False

    def released(self) -> None:
        """A probe ended without a verdict on the engine (the client went away, or its own error)."""
        self.probing = False


def died(error: BaseException | None = None, chunk: Any = None) -> bool:
    """Whether an exception (``DIED``, by class name in its MRO) or a first chunk (a 5xx naming
    ``DIED``) says the engine or its replica's actor died while serving."""
    if error is not None:
        return any(cls.__name__ in DIED for cls in type(error).__mro__)
    found = error_of(chunk)
    if found is None or (found.error.code or 500) < 500:
        return False
    text = f"{found.error.type} {found.error.message}"
    return any(name in text for name in (*DIED, *DIED_TEXTS))


def unavailable(error: BaseException) -> bool:
    """Whether ``error`` says the replica, its actor or its engine is gone (``UNAVAILABLE``), not
    that the request was wrong."""
    return any(cls.__name__ in UNAVAILABLE for cls in type(error).__mro__)


def error_of(chunk: Any) -> Any:
    """The ErrorResponse a first chunk is (or begins with, when batched), else None."""
    first = chunk[0] if isinstance(chunk, list) and chunk else chunk
    return first if isinstance(first, ErrorResponse) else None


def retryable(chunk: Any) -> str | None:
    """Why a first chunk means the engine did not serve (a server-side error: 5xx), or None. A
    poisoned refusal (``POISONED_TYPE``: the other phase died serving this very request) is a verdict
    on the request, answered by a healthy replica: passed through, so no breaker opens on it."""
    error = error_of(chunk)
    if error is not None and (error.error.code or 500) >= 500 and error.error.type != POISONED_TYPE:
        return f"HTTP {error.error.code}: {error.error.message[:200]}"
    return None


async def attempt(
    method: Any, args: tuple[Any, ...], wait_s: float, first_s: float | None = None, tries: int = REPLICAS_TRIED
) -> AsyncGenerator[Any, None]:
    """One phase's stream for ``args`` through ``method`` (a streaming handle's method). A replica
    that refuses before its first chunk is left for another replica of the phase (up to ``tries``
    replicas; the router's choice of another within ``OTHER_REPLICA_WAIT_S``); ``Refused`` when none
    serves: see ``attempt_one``. An error that is not the phase's availability passes through."""
    failed: set[str] = set()
    wait, first_refusal = wait_s, None
    while True:
        try:
            async for chunk in attempt_one(method, args, wait, first_s, failed):
                yield chunk
            return
        except Refused as refused:
            if refused.died:  # the request may have killed it: no other replica takes it
                raise
            if refused.replica is None:  # no replica (no other one): the first refusal says why
                raise (first_refusal or refused) from None
            if len(failed) >= tries:
                raise
            first_refusal = first_refusal or refused
            wait = OTHER_REPLICA_WAIT_S


async def attempt_one(
    method: Any, args: tuple[Any, ...], wait_s: float, first_s: float | None = None, avoid: set[str] | None = None
) -> AsyncGenerator[Any, None]:
    """One replica's stream, raising ``Refused`` before its first chunk when no replica (but those in
    ``avoid``) takes it within ``wait_s`` (Serve's ``choose_replica`` bounds the router's wait and
    nothing else), its first chunk is a server error, the replica or its engine is gone first
    (``unavailable``), or (``first_s``) that chunk takes longer. A replica that refused is added to
    ``avoid``. Any other exception is the request's own and passes through."""
    avoid = avoid if avoid is not None else set()
    deadline = time.monotonic() + wait_s
    # A replica to avoid that the router chose is held until another is chosen: its reserved slot
    # makes the router's next choice (the less loaded of two) the other replica.
    held: list[Any] = []
    try:
        for _ in range(CHOICES_PER_TRY):
            manager = method.choose_replica(*args)
            try:
                selection = await asyncio.wait_for(manager.__aenter__(), max(deadline - time.monotonic(), 0.001))
            except TimeoutError:
                raise Refused(f"no replica within {wait_s:g} s") from None
            except Exception as error:  # DeploymentUnavailableError, a replica that died while chosen
                raise Refused(f"{type(error).__name__}: {error}"[:300]) from None
            replica = str(getattr(selection, "replica_id", "") or id(selection))
            if replica not in avoid:
                break
            held.append(manager)
        else:
            raise Refused(f"only replicas that already failed it: {len(avoid)}")
    finally:
        for manager_held in held:  # the slots go back
            await manager_held.__aexit__(None, None, None)
    failure: tuple[Any, Any, Any] = (None, None, None)
    try:
        stream = method.dispatch(selection, *args)
        try:
            first = await asyncio.wait_for(stream.__anext__(), first_s)
        except StopAsyncIteration:
            avoid.add(replica)
            raise Refused("ended before its first chunk", replica) from None
        except TimeoutError:
            stream.cancel()
            avoid.add(replica)
            raise Refused(f"no answer within {first_s:g} s", replica) from None
        except Exception as error:
            if not unavailable(error):  # the request's own error (its model, its input): not the phase's
                raise
            avoid.add(replica)
            raise Refused(f"{type(error).__name__}: {error}"[:300], replica, died(error)) from None
        reason = retryable(first)
        if reason is not None:
            async for _ in stream:  # drained inside the selection, as Serve asks
                pass
            avoid.add(replica)
            raise Refused(reason, replica, died(chunk=first))
        yield first
        async for chunk in stream:
            yield chunk
    except BaseException:
        failure = sys.exc_info()
        raise
    finally:
        await manager.__aexit__(*failure)


class _Counter:
    """The path counter, made where it is used (Ray's metrics need a running Ray)."""

    def __init__(self) -> None:
        from ray.serve.metrics import Counter

        self.counter = Counter(METRIC, description="Requests by the path that served them.", tag_keys=("path",))

    def count(self, path: str) -> None:
        self.counter.inc(tags={"path": path})

    async def counted(self, path: str, chunks: AsyncGenerator[Any, None]) -> AsyncGenerator[Any, None]:
        """``chunks``, counted on ``path`` once its first chunk is an answer (not an error: a 5xx
        is served again elsewhere and counted there, a 4xx is the client's and no path)."""
        first = True
        async for chunk in chunks:
            if first and error_of(chunk) is None:
                self.count(path)
            first = False
            yield chunk


def _method(request: Any) -> str:
    if isinstance(request, ChatCompletionRequest):
        return "chat"
    if isinstance(request, CompletionRequest):
        return "completions"
    raise ValueError(f"Unsupported request type: {type(request)}")


def bad_request(message: str, param: str | None = None) -> ErrorResponse:
    return ErrorResponse(error=ErrorInfo(message=message, type="BadRequestError", code=400, param=param))


def _off_shape(value: Any, shape: Any, path: str) -> str | None:
    """The path of the first part of ``value`` that ``shape`` does not allow (``REQUEST_SHAPES``), or None."""
    if shape == ANY:
        return None
    if isinstance(shape, tuple):  # one of several shapes: the one for the value's JSON type
        kind = dict if isinstance(value, dict) else list if isinstance(value, list) else str
        for option in shape:
            if (kind is str and option == SCALAR) or isinstance(option, kind):
                return _off_shape(value, option, path)
        return path
    if shape == SCALAR:
        return None if value is None or isinstance(value, (str, int, float, bool)) else path
    if isinstance(shape, list):
        if not isinstance(value, list):
            return path
        for index, item in enumerate(value):
            off = _off_shape(item, shape[0], f"{path}[{index}]")
            if off is not None:
                return off
        return None
    if not isinstance(value, dict):
        return path
    for key, item in value.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in shape:
            return where
        off = _off_shape(item, shape[key], where)
        if off is not None:
            return off
    return None


def request_refusal(fields: Any, method: str, trust_templates: bool = False) -> ErrorResponse | None:
    """400 for a request (its JSON as the client sent it) with a field or key this deployment does
    not serve, at any depth (``REQUEST_SHAPES``), naming it as ``param``; else None."""
    shape = REQUEST_SHAPES[method]
    if trust_templates and method == "chat":
        kwargs = {**shape["chat_template_kwargs"], **_TRUSTED_TEMPLATE}
        shape = {**shape, **_TRUSTED_TEMPLATE, "chat_template_kwargs": kwargs}
    off = _off_shape(fields, shape, "")
    if off is None:
        tools = fields.get("tools") if isinstance(fields, dict) else None
        if isinstance(tools, list) and len(tools) > MAX_TOOLS:
            return bad_request(f"A request may carry at most {MAX_TOOLS} tools; this one has {len(tools)}.", "tools")
        return None
    top = off.split(".", 1)[0].split("[", 1)[0]
    if top in ORCHESTRATOR_FIELDS or off.startswith("vllm_xargs."):
        why = "is set by the server between its engines; a request may not carry it"
    elif off.endswith("chat_template") or top == "chat_template":
        why = "is a template the tokenizer would run; this deployment does not trust request templates"
    else:
        why = "is not a field this deployment serves, or not of the type it takes"
    return bad_request(f"'{off}' {why}.", off)


def scrub(request: Any, keep_transfer: bool = False) -> None:
    """Clears what only the orchestrator sets, on every engine path whatever the ingress did:
    ``kv_transfer_params`` and ``ec_transfer_params`` (unless ``keep_transfer``: decode's own, on
    prefill's side) and every ``vllm_xargs`` key but ``VLLM_XARGS``."""
    if not keep_transfer:
        for field in ORCHESTRATOR_FIELDS:
            if getattr(request, field, None) is not None:
                setattr(request, field, None)
    xargs = getattr(request, "vllm_xargs", None)
    if xargs is not None:
        kept = {k: v for k, v in xargs.items() if k in VLLM_XARGS} if isinstance(xargs, dict) else {}
        request.vllm_xargs = kept or None


def client_fields(body: Any) -> dict[str, Any]:
    """What the client sent, as JSON: the fields it set and any extra ones vLLM's models keep."""
    return dict(body.model_dump(mode="json", exclude_unset=True))


REASONING_END = "</think>"


def _texts(value: Any, keys: bool = False) -> list[str]:
    """Every string inside ``value``, depth first; with ``keys``, the mappings' keys too (a schema
    rendered as JSON)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [t for k, v in value.items() for t in (*([k] if keys else []), *_texts(v, keys))]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _texts(item, keys)]
    return []


def _dumped(item: Any) -> Any:
    return item.model_dump(mode="json", exclude_unset=True) if hasattr(item, "model_dump") else item


def prompt_chars(request: Any) -> int:
    """The characters a chat template can render of the request, each counted once, in one pass: every
    message of every role (an assistant's text from its last reasoning block's end: templates drop
    what comes before; its reasoning fields and tool calls, names and arguments, in full), the tools'
    schemas, the documents and the template options' values; or the completion prompt's text. Each
    string but its leading and trailing whitespace (templates trim its ends at most)."""
    texts: list[str] = []
    if isinstance(request, ChatCompletionRequest):
        for message in request.messages:
            message = _dumped(message)
            if not isinstance(message, dict):
                continue
            for key, value in message.items():
                if key == "content" and message.get("role") == "assistant" and isinstance(value, str):
                    texts.append(value.rpartition(REASONING_END)[2])
                elif key != "role":
                    texts += _texts(value)
        texts += _texts([_dumped(t) for t in request.tools or []], keys=True)
        texts += _texts(getattr(request, "documents", None))
        texts += _texts(list((request.chat_template_kwargs or {}).values()))
    else:
        texts += [
            p for p in (request.prompt if isinstance(request.prompt, list) else [request.prompt]) if isinstance(p, str)
        ]
    return sum(len(text.strip()) for text in texts)


def prompt_ids(request: Any) -> list[int]:
    """The length of each token-id prompt of a completion request (a list of ids, or a list of them)."""
    prompt = getattr(request, "prompt", None)
    if not isinstance(prompt, list) or not prompt:
        return []
    if all(isinstance(p, int) for p in prompt):
        return [len(prompt)]
    return [len(p) for p in prompt if isinstance(p, list)]


def too_long(request: Any, chars_limit: int | None, max_model_len: int | None = None) -> ErrorResponse | None:
    """400 when the request cannot fit ``max_model_len`` tokens, counted without a tokenizer: more
    messages than it has tokens (each renders at least one), a token-id prompt longer, or more
    characters (``prompt_chars``) than ``chars_limit``; else None."""
    chat = isinstance(request, ChatCompletionRequest)
    param = "messages" if chat else "prompt"
    if max_model_len is not None:
        if chat and len(request.messages) > max_model_len:
            return bad_request(
                f"The request has {len(request.messages)} messages, more than this model's max_model_len "
                f"({max_model_len}) tokens can hold. Send fewer.",
                param,
            )
        longest = max(prompt_ids(request), default=0)
        if longest > max_model_len:
            return bad_request(
                f"The prompt has {longest} token ids, more than this model's max_model_len ({max_model_len}). "
                "Shorten it.",
                param,
            )
    if chars_limit is None:
        return None
    chars = prompt_chars(request)
    if chars <= chars_limit:
        return None
    return bad_request(
        f"The prompt has {chars} characters, more than this model's max_model_len tokens can "
        f"hold (at most {chars_limit} characters). Shorten it.",
        param,
    )


async def _one(chunk: Any) -> AsyncGenerator[Any, None]:
    yield chunk


class _Prompts:
    """What both engines check of a prompt before any tokenizer reads it, and its token count off
    the event loop. Mixed into the two servers (``self.engine``, ``self._llm_config``: LLMServer's)."""

    _longest_token: int | None = None

    def _tokenizer(self) -> Any:
        return self.engine._engine_client.tokenizer  # type: ignore[attr-defined]

    def _down(self) -> ErrorResponse | None:
        """A 503 when this replica's engine was already dead when the request arrived (vLLM's
        ``AsyncLLM.errored``): the phase was unavailable before the request, which the other phase may
        then serve (``died`` is false of it). None while the engine runs."""
        try:
            errored = bool(self.engine._engine_client.errored)  # type: ignore[attr-defined]
        except Exception:
            return None
        if not errored:
            return None
        return ErrorResponse(error=ErrorInfo(message=ENGINE_DOWN, type=ENGINE_DOWN_TYPE, code=503))

    def _max_model_len(self) -> int | None:
        configured = self._llm_config.engine_kwargs.get("max_model_len")  # type: ignore[attr-defined]
        if configured:
            return int(configured)
        try:
            return int(self.engine._engine_client.model_config.max_model_len)  # type: ignore[attr-defined]
        except Exception:
            return None

    async def prompt_chars_limit(self) -> int | None:
        """The most characters a prompt that fits ``max_model_len`` tokens can have: ``max_model_len``
        times the tokenizer's longest token. None when unknown. The ingress asks decode for it once,
        to refuse a longer prompt before it crosses to an engine."""
        limit = self._max_model_len()
        if limit is None:
            return None
        if self._longest_token is None:
            try:
                vocab = await asyncio.to_thread(lambda: self._tokenizer().get_vocab())
                self._longest_token = max(len(token) for token in vocab) or 1
            except Exception:
                return None
        return limit * self._longest_token

    async def _oversized(self, request: Any) -> ErrorResponse | None:
        """400 for a prompt that cannot fit ``max_model_len`` tokens (``prompt_chars_limit``): no
        tokenizer reads it. None when it may fit, or when the bound is unknown."""
        return too_long(request, await self.prompt_chars_limit(), self._max_model_len())

    async def _prompt_tokens(self, request: Any) -> int | None:
        """The prompt's length by this engine's tokenizer over what the chat template renders (the
        request's tools, documents and the template options vLLM would pass it), in ``COUNTS``'s
        threads within ``COUNT_TIMEOUT_S``; None if unknown or late (the standard path). Ray's
        ``tokenize`` is refused for generation models, so the tokenizer is vLLM's own."""
        try:
            tokenizer = self._tokenizer()
            if isinstance(request, ChatCompletionRequest):
                messages = [m if isinstance(m, dict) else m.model_dump() for m in request.messages]
                options = template_options(tokenizer, request.chat_template_kwargs or {})
                if request.tools:
                    options["tools"] = [t if isinstance(t, dict) else t.model_dump() for t in request.tools]
                if getattr(request, "documents", None):
                    options["documents"] = request.documents
                options.update(
                    add_generation_prompt=request.add_generation_prompt,
                    continue_final_message=request.continue_final_message,
                )

                def count() -> int:
                    text = tokenizer.apply_chat_template(messages, tokenize=False, **options)
                    return len(tokenizer.encode(text, add_special_tokens=False))

            elif isinstance(request.prompt, str):
                prompt = request.prompt

                def count() -> int:
                    return len(tokenizer.encode(prompt, add_special_tokens=False))

            else:  # token ids, or several prompts: the standard path
                return None
            counted = asyncio.get_running_loop().run_in_executor(COUNTS, count)
            return await asyncio.wait_for(counted, COUNT_TIMEOUT_S)
        except Exception:  # unknown length or late: the standard path
            return None


def template_options(tokenizer: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The request's template options as vLLM passes them to the model's template: the allowed
    ``TEMPLATE_KWARGS`` (never ``chat_template`` or ``tokenize``: client code, a count that is not
    text), and of those only what vLLM's ``resolve_chat_template_kwargs`` keeps for this template."""
    options = {k: v for k, v in kwargs.items() if k in TEMPLATE_KWARGS}
    try:
        from vllm.renderers.hf import resolve_chat_template_kwargs

        template = tokenizer.get_chat_template(None)
        return dict(resolve_chat_template_kwargs(tokenizer, template, options, raise_on_unexpected=False))
    except Exception:  # another vLLM's layout: the allowed switches, which are scalars
        return options


class FailoverPrefillServer(_Prompts, PDPrefillServer):  # type: ignore[misc]
    """Ray's prefill server; a request without ``kv_transfer_params`` (the ingress's fallback) is
    served whole by its engine, as any LLMServer serves it, once its prompt may fit. Decode's
    request names decode's ``pair``: another than this engine's (one phase updated before the
    other) is refused with a 503 before the engine sees it, so decode prefills it itself."""

    async def __init__(  # type: ignore[misc]
        self, llm_config: Any, *, pair: str = "", covered: list[list[str]] | None = None, **kwargs: Any
    ) -> None:
        check_versions(covered or [])
        self._pair = pair
        self._unpaired_seen: set[str] = set()
        await super().__init__(llm_config, **kwargs)
        self._after_start = engine_started(self)

    def _unpaired(self, pair: str | None) -> Any:
        if pair is None or pair == self._pair:
            return None
        message = f"this prefill engine serves pair {self._pair[:40]}, the request's decode {pair[:40]}"
        if pair not in self._unpaired_seen:  # once per other pair: one phase updated before the other
            self._unpaired_seen.add(pair)
            logger.warning("%s: %s; decode prefills locally until both phases agree", FALLBACK_LINE, message)
        return _one(ErrorResponse(error=ErrorInfo(message=message, type=PAIR_MISMATCH_TYPE, code=503)))

    async def chat(self, request: Any, raw_request_info: Any = None, pair: str | None = None) -> Any:
        refusal = self._unpaired(pair)
        if refusal is not None:
            return refusal
        scrub(request, keep_transfer=pair is not None)  # decode's own transfer params only
        refusal = self._down() or await self._oversized(request)
        return _one(refusal) if refusal is not None else await super().chat(request, raw_request_info)

    async def completions(self, request: Any, raw_request_info: Any = None, pair: str | None = None) -> Any:
        refusal = self._unpaired(pair)
        if refusal is not None:
            return refusal
        scrub(request, keep_transfer=pair is not None)
        refusal = self._down() or await self._oversized(request)
        return _one(refusal) if refusal is not None else await super().completions(request, raw_request_info)


class FailoverDecodeServer(_Prompts, PDDecodeServer):  # type: ignore[misc]
    """Ray's decode orchestrator, prefilling locally when prefill cannot, or when the prompt is short.
    Its prefill is another application's deployment, by name (``prefill``: app and deployment),
    resolved at the first call, so the two start in any order."""

    async def __init__(  # type: ignore[misc]  # Serve's async constructor, as Ray's PDDecodeServer has
        self,
        llm_config: Any,
        *,
        prefill: dict[str, str],
        pair: str,
        covered: list[list[str]] | None = None,
        **kwargs: Any,
    ) -> None:
        check_versions(covered or [])
        self._failover = DEFAULT_FAILOVER
        self._pair = pair
        self._prefill = Breaker("prefill")
        self._poisoned = Poisoned()
        self._poisoned.warm()
        self._paths = _Counter()
        handle = other_phase(prefill)
        await super().__init__(llm_config, prefill_server=handle, **kwargs)
        self._after_start = engine_started(self)

    def reconfigure(self, user_config: Any) -> None:
        """The failover's settings (the deployment's ``user_config``): a change restarts nothing."""
        self._failover = Failover.parse(user_config)

    def _local(self, method: str, request: Any, raw: Any, path: str) -> AsyncGenerator[Any, None]:
        async def chunks() -> AsyncGenerator[Any, None]:
            async for chunk in await getattr(LLMServer, method)(self, request, raw):
                yield chunk

        return self._paths.counted(path, chunks())

    def _prefill_method(self, method: str, raw_request_info: Any) -> Any:
        """The prefill handle's method with the client's session (Ray's own orchestrator keeps it:
        Serve carries no session over a second hop) and adapter."""
        handle = self._prefill_handle
        if raw_request_info is not None:
            from ray.serve._private.http_util import session_id_from_headers

            session_id = session_id_from_headers(raw_request_info.headers)
            if session_id:
                handle = handle.options(session_id=session_id)
        adapter = serve.get_multiplexed_model_id()
        if adapter:
            handle = handle.options(multiplexed_model_id=adapter)
        return getattr(handle, method)

    async def _pd_handle_request(self, request: Any, raw_request_info: Any = None) -> AsyncGenerator[Any, None]:
        method = _method(request)
        scrub(request)  # the ingress refuses them; never an engine's from a client
        refusal = self._down() or await self._oversized(request)
        if refusal is None and self._prefill.open_until is not None and await self._poisoned.holds(request):
            # prefill is skipped, and this body killed it moments ago: not served here either
            refusal = poisoned_refusal("prefill")
        if refusal is not None:
            yield refusal
            return
        failover = self._failover
        if failover.short_prompt_tokens:
            tokens = await self._prompt_tokens(request)
            if tokens is not None and tokens <= failover.short_prompt_tokens:
                async for chunk in self._local(method, request, raw_request_info, "short_prompt"):
                    yield chunk
                return
        if not self._prefill.admit():
            async for chunk in self._local(method, request, raw_request_info, "local_prefill"):
                yield chunk
            return
        prefill_chunk = None
        try:  # the probe, if this is one, is settled on every exit
            backend = self._get_connector_backend()
            prefill_request = backend.prepare_prefill_request(request=request, peer=None)
            self._request_prefill_token_ids(prefill_request)
            chunks = attempt(
                self._prefill_method(method, raw_request_info),
                (prefill_request, raw_request_info, self._pair),
                failover.wait_s,
                failover.prefill_timeout_s,
            )
            try:
                prefill_chunk = await chunks.__anext__()
                async for _ in chunks:  # prefill answers one token: drained inside its selection
                    pass
            finally:
                await chunks.aclose()
        except Refused as refused:
            self._prefill.failed(str(refused))
            if refused.died:  # this request may have killed prefill: never replayed here
                refusal = self._poisoned.died_serving(request, "prefill")
                self._paths.count("refused")
                yield refusal
                return
        except StopAsyncIteration:
            self._prefill.failed("no answer")
        except BaseException:
            self._prefill.released()
            raise
        if prefill_chunk is None:
            async for chunk in self._local(method, request, raw_request_info, "local_prefill"):
                yield chunk
            return
        self._prefill.succeeded()
        if error_of(prefill_chunk) is not None:  # a 4xx (5xx are refused): the client's, as Ray answers it
            yield prefill_chunk
            return
        decode_request = backend.prepare_decode_request(request=request, peer=None, prefill_response=prefill_chunk)
        from ray.llm._internal.common.patches.vllm.tokenize_once import reuse_prompt_token_ids

        with reuse_prompt_token_ids(self._decode_reuse_ids(prefill_chunk)):
            stream = await getattr(LLMServer, method)(self, decode_request, raw_request_info)
            async for chunk in self._paths.counted("disaggregated", stream):
                yield chunk


class FailoverIngress(OpenAiIngress):  # type: ignore[misc]
    """Ray's OpenAI ingress, sending a request whole to the prefill engine when decode cannot take it."""

    def __init__(
        self,
        model_cards: dict[str, Any],
        *,
        phases: dict[str, dict[str, dict[str, str]]],
        adapters: tuple[str, ...] = (),
        max_model_lens: dict[str, int | None] | None = None,
        trusted_templates: tuple[str, ...] = (),
        **kwargs: Any,
    ) -> None:
        """``phases``: each model's decode and prefill deployments by application and name;
        ``max_model_lens``: each model's; ``trusted_templates``: the models whose engines trust a
        request's chat template (vLLM's ``trust_request_chat_template``)."""
        decode = {model: other_phase(where["decode"]) for model, where in phases.items()}
        super().__init__(decode, model_cards, **kwargs)
        self._failover = DEFAULT_FAILOVER
        self._whole = {model: other_phase(where["prefill"]).options(stream=True) for model, where in phases.items()}
        self._adapters = frozenset(adapters)
        self._max_model_lens = dict(max_model_lens or {})
        self._trusted_templates = frozenset(trusted_templates)
        self._decode = Breaker("decode")
        self._poisoned = Poisoned()
        self._poisoned.warm()
        self._paths = _Counter()
        self._chars_limits: dict[str, int | None] = {}
        self._ask_limit_after = 0.0

    def reconfigure(self, user_config: Any) -> None:
        """The failover's settings (the deployment's ``user_config``): a change restarts nothing."""
        self._failover = Failover.parse(user_config)

    async def _chars_limit(self, model: str, decode: Any) -> int | None:
        """Decode's ``prompt_chars_limit`` for ``model``, asked once while decode is believed up
        (None meanwhile: the engines check it themselves). A failed ask is not repeated for
        ``COOLDOWN_S``, so a decode outage never delays every request by an ask."""
        if model in self._chars_limits:
            return self._chars_limits[model]
        if self._decode.open_until is not None or time.monotonic() < self._ask_limit_after:
            return None
        try:
            answer = decode.options(stream=False).prompt_chars_limit.remote()
            limit: int | None = await asyncio.wait_for(answer, self._failover.wait_s)
        except Exception:
            self._ask_limit_after = time.monotonic() + COOLDOWN_S
            return None
        self._chars_limits[model] = limit
        return limit

    def _client_refusal(self, body: Any, call_method: str, fields: Any) -> JSONResponse | None:
        """What this ingress answers itself, before any engine: 400 for a field or key this
        deployment does not serve (``request_refusal`` over ``fields``, the JSON the client sent),
        404 for an adapter of a model that has none."""
        model = getattr(body, "model", None)
        if call_method in REQUEST_SHAPES:
            base = model.split(":", 1)[0] if isinstance(model, str) else None
            refused = request_refusal(fields, call_method, base in self._trusted_templates)
            if refused is not None:
                return _error_response(400, refused.error.message, "BadRequestError", refused.error.param)
        if isinstance(model, str) and ":" in model:
            base = model.split(":", 1)[0]
            if base in self._whole and base not in self._adapters:
                message = f"The model '{model}' does not exist: '{base}' serves no adapters."
                return _error_response(404, message, "NotFoundError", "model")
        return None

    async def _get_response(self, *, body: Any, call_method: str, raw_request: Any = None) -> AsyncGenerator[Any, None]:
        if call_method not in ("chat", "completions"):
            async for chunk in super()._get_response(body=body, call_method=call_method, raw_request=raw_request):
                yield chunk
            return
        model_id = await self._get_model_id(body.model)
        decode = self._get_configured_serve_handle(model_id)
        whole = self._whole[model_id.split(":", 1)[0]]
        if model_id != model_id.split(":", 1)[0]:
            whole = whole.options(multiplexed_model_id=model_id)
        if raw_request is not None:
            from ray.serve._private.http_util import session_id_from_headers

            session_id = session_id_from_headers(raw_request.headers)
            if session_id:
                decode, whole = decode.options(session_id=session_id), whole.options(session_id=session_id)
        if isinstance(body, ChatCompletionRequest):
            from ray.llm._internal.serve.core.ingress.utils import _sanitize_chat_completion_request

            body = _sanitize_chat_completion_request(body)
        base = model_id.split(":", 1)[0]
        refusal = too_long(body, await self._chars_limit(base, decode), self._max_model_lens.get(base))
        if refusal is not None:  # before it crosses to any engine, answered whole (``param`` kept)
            raise ClientRefusal(refusal)
        raw = RawRequestInfo.from_starlette_request(raw_request) if raw_request is not None else None
        wait_s, reasons = self._failover.wait_s, []
        if self._decode.admit():
            try:
                async for chunk in self._first_then_rest(
                    attempt(getattr(decode, call_method), (body, raw), wait_s), self._decode
                ):
                    yield chunk
                return
            except Refused as refused:
                self._decode.failed(str(refused))
                if refused.died:  # this request may have killed decode: never replayed on prefill
                    refusal = self._poisoned.died_serving(body, "decode")
                    self._paths.count("refused")
                    yield refusal
                    return
                reasons.append(f"decode: {refused}")
        if await self._poisoned.holds(body):  # it killed decode moments ago: prefill is not offered it
            self._paths.count("refused")
            yield poisoned_refusal("decode")
            return
        try:
            chunks = attempt(getattr(whole, call_method), (body, raw), wait_s)
            first = await chunks.__anext__()
        except Refused as refused:
            reasons.append(f"prefill: {refused}")
            self._paths.count("refused")
            logger.warning("%s: refused a request (HTTP 503): %s", FALLBACK_LINE, "; ".join(reasons))
            yield ErrorResponse(error=ErrorInfo(message=REFUSAL.format(int(COOLDOWN_S)), type=REFUSED_TYPE, code=503))
            return

        async def rest() -> AsyncGenerator[Any, None]:
            yield first
            async for chunk in chunks:
                yield chunk

        async for chunk in self._paths.counted("prefill_whole", rest()):
            yield chunk

    @staticmethod
    async def _first_then_rest(chunks: AsyncGenerator[Any, None], breaker: Breaker) -> AsyncGenerator[Any, None]:
        """``chunks``, the breaker told how the first one went (decode counts its own path)."""
        try:
            first = await chunks.__anext__()
        except Refused:
            raise
        except BaseException:  # the client's own error, or the client went away: no verdict
            breaker.released()
            raise
        breaker.succeeded()
        yield first
        async for chunk in chunks:
            yield chunk

    async def _process_llm_request(self, body: Any, call_method: str, raw_request: Any = None) -> Response:
        """Ray's, after ``_client_refusal``, with the ingress's own refusals answered whole: a client's
        (``ClientRefusal``), and the pair's 503s with ``Retry-After`` (Ray's error path sets no header
        and names every error by its own class)."""
        fields = await _sent(body, raw_request)
        refusal = self._client_refusal(body, call_method, fields)
        if refusal is not None:
            return refusal
        try:
            return await super()._process_llm_request(body, call_method, raw_request)
        except ClientRefusal as refused:
            error = refused.response.error
            return _error_response(error.code or 400, error.message, error.type, error.param)
        except OpenAIHTTPException as error:
            if error.status_code != 503 or error.type not in (REFUSED_TYPE, POISONED_TYPE):
                raise
            return _error_response(503, error.message, error.type, None, {"Retry-After": str(int(COOLDOWN_S))})


class ClientRefusal(Exception):
    """The ingress's own answer to a client's request (``response``, an ErrorResponse), raised out of
    ``_get_response`` so that ``_process_llm_request`` answers it whole: Ray's error path keeps only
    a first chunk's message and code, not its ``param`` or type."""

    def __init__(self, response: Any) -> None:
        super().__init__(response.error.message)
        self.response = response


async def _sent(body: Any, raw_request: Any) -> Any:
    """The request's JSON as the client sent it (FastAPI has read and kept it), else the fields the
    parsed body holds as set."""
    if raw_request is not None:
        try:
            return await raw_request.json()
        except Exception:
            pass
    return client_fields(body)


def _error_response(
    code: int, message: str, kind: str, param: str | None, headers: dict[str, str] | None = None
) -> JSONResponse:
    """OpenAI's error shape, which its SDKs turn into the matching exception."""
    content = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(status_code=code, content=content, headers=headers)


def engine_started(server: Any) -> asyncio.Task[None] | None:
    """Run the ``LLMConfig`` callback's ``on_engine_started``, if it has one, in the background once
    the replica's engine started healthy (the node cache shares its compile caches then); the task,
    which the replica keeps. Ray Serve LLM 2.58's callbacks have no hook after the engine's start.
    What runs there is an optimization: nothing of it fails the replica, which serves already."""
    try:
        hook = getattr(server._llm_config.get_or_create_callback(), "on_engine_started", None)
    except Exception as error:
        logger.warning("the LLMConfig callback's on_engine_started was not run (%s: %s)", type(error).__name__, error)
        return None
    return asyncio.get_running_loop().create_task(hook()) if hook is not None else None


def other_phase(where: dict[str, str]) -> Any:
    """A handle to another application's deployment (``{"app": ..., "deployment": ...}``) by name,
    not looked up until its first call: that application may start after this one, or restart
    while this one serves (a call then waits for a replica, which ``attempt`` bounds)."""
    return serve.get_deployment_handle(where["deployment"], where["app"], _check_exists=False)


def check_versions(covered: list[list[str]]) -> None:
    """Raise one line when this process's Ray and vLLM are not a pair the failover's upstream record
    covers (``covered``: ``[ray, vllm]`` pairs; the package's ``upstream.COVERED``): the overridden
    Ray code was recorded for those alone."""
    import ray
    import vllm

    found = [ray.__version__.split("+")[0], vllm.__version__.split("+")[0]]  # a build's local part aside
    if covered and found not in covered:
        pairs = ", ".join(f"Ray {r} + vLLM {v}" for r, v in covered)
        raise RuntimeError(
            f"eks_pd_failover: this image runs Ray {found[0]} + vLLM {found[1]}, which the failover's upstream "
            f"record does not cover ({pairs}). Fix: use the pinned image, or record this pair "
            "(python tools/ray_upstream.py) and synthesize again."
        )


def _phase_config(args: dict[str, Any], keys: tuple[str, ...]) -> tuple[Any, dict[str, Any]]:
    unknown = sorted(set(args) - {"llm_config", "pair", "covered", *keys})
    if unknown or "llm_config" not in args or not isinstance(args.get("pair"), str):
        raise ValueError(f"eks_pd_failover: a phase's args are llm_config, pair and {keys}; got {sorted(args)}")
    config = LLMConfig.model_validate(args["llm_config"])
    if config.engine_kwargs.get("data_parallel_size", 1) > 1:
        raise ValueError("eks_pd_failover: data_parallel_size above 1 is not supported; use build_pd_openai_app")
    return config, args


def build_prefill_app(args: dict[str, Any]) -> Any:
    """One model's prefill phase, an application of its own (deployment ``Prefill:<model>``)."""
    config, args = _phase_config(args, ())
    bound = {"pair": args["pair"], "covered": list(args.get("covered") or [])}
    return build_llm_deployment(config, name_prefix="Prefill:", bind_kwargs=bound, deployment_cls=FailoverPrefillServer)


def build_decode_app(args: dict[str, Any]) -> Any:
    """One model's decode phase, an application of its own, calling its prefill by name."""
    config, args = _phase_config(args, ("prefill",))
    prefill = args.get("prefill")
    if not isinstance(prefill, dict) or set(prefill) != {"app", "deployment"}:
        raise ValueError(f"eks_pd_failover: decode's prefill is {{app, deployment}}; got {prefill!r}")
    return build_llm_deployment(
        config,
        name_prefix="Decode:",
        bind_kwargs={"prefill": dict(prefill), "pair": args["pair"], "covered": list(args.get("covered") or [])},
        deployment_cls=FailoverDecodeServer,
    )


@dataclass(frozen=True)
class _Card:
    """What Ray's model card reads of an LLMConfig (``to_model_metadata``), without the engine
    settings: an engine change then leaves the ingress's args as they were."""

    model_id: str
    max_request_context_length: int | None
    input_modality: str = "text"


def build_ingress_app(args: dict[str, Any]) -> Any:
    """The OpenAI ingress on ``/`` for every model, with the failover above: each model's decode and
    prefill are other applications' deployments, by name. Ray's ingress deployment's name (its
    class's), so dashboards and alarms see the same deployments."""
    models = args.get("models")
    if set(args) != {"models"} or not isinstance(models, list) or not models:
        raise ValueError(f"eks_pd_failover: the ingress's args are models (a list); got {sorted(args)}")
    phases, cards, adapters, lengths, trusted = {}, {}, [], {}, []
    for model in models:
        unknown = sorted(set(model) - set(INGRESS_MODEL_KEYS))
        if unknown:
            raise ValueError(f"eks_pd_failover: an ingress model's keys are {INGRESS_MODEL_KEYS}; got {unknown}")
        model_id = model["model_id"]
        phases[model_id] = {phase: dict(model[phase]) for phase in ("decode", "prefill")}
        lengths[model_id] = model.get("max_model_len")
        cards[model_id] = to_model_metadata(model_id, _Card(model_id, lengths[model_id]))
        if model.get("adapters"):
            adapters.append(model_id)
        if model.get("trust_request_chat_template"):
            trusted.append(model_id)
    options = {"name": INGRESS_NAME, **FailoverIngress.get_deployment_options(None)}
    return serve.deployment(make_fastapi_ingress(FailoverIngress), **options).bind(
        model_cards=cards,
        phases=phases,
        adapters=tuple(adapters),
        max_model_lens=lengths,
        trusted_templates=tuple(trusted),
    )
