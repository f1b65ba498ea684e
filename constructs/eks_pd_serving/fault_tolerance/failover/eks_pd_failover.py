"""The PD pair's failover (pod-side): no request fails for one engine's fault.

Ray Serve LLM 2.58's ``build_pd_openai_app`` is ingress -> ``PDDecodeServer`` -> ``PDPrefillServer``
and always prefills remotely: a dead prefill fails or holds every request, a dead decode holds
them all (Serve's router waits for a replica as long as there is none). Yet both engines are full
vLLM engines of one model. ``build_failover_app`` composes the same public pieces (Ray's
``PDServingArgs``, ``build_llm_deployment``, ``PDDecodeServer``/``PDPrefillServer``,
``OpenAiIngress``) into the same OpenAI surface, with the same deployment names, plus:

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

Each request's path is counted (``METRIC``, tag ``path``: one of ``PATHS``) on Ray's metrics
endpoint. It imports nothing of the package.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from ray import serve
from ray.llm._internal.common.dict_utils import maybe_apply_llm_deployment_config_defaults
from ray.llm._internal.serve.core.configs.openai_api_models import (
    ChatCompletionRequest,
    CompletionRequest,
    ErrorInfo,
    ErrorResponse,
    OpenAIHTTPException,
    to_model_metadata,
)
from ray.llm._internal.serve.core.ingress.ingress import OpenAiIngress, make_fastapi_ingress
from ray.llm._internal.serve.core.protocol import RawRequestInfo
from ray.llm._internal.serve.core.server.builder import build_llm_deployment
from ray.llm._internal.serve.core.server.llm_server import LLMServer
from ray.llm._internal.serve.serving_patterns.prefill_decode.builder import PDServingArgs
from ray.llm._internal.serve.serving_patterns.prefill_decode.pd_server import PDDecodeServer, PDPrefillServer
from starlette.responses import JSONResponse, Response

IMPORT_PATH = "eks_pd_failover:build_failover_app"
# The serve config's args: Ray's PDServingArgs plus this key, taken off before Ray validates them.
ARGS_KEY = "failover"
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

logger = logging.getLogger("ray.serve")


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


class Refused(Exception):
    """An engine did not take the request before its first chunk: nothing was sent to the client."""


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
        """A probe ended without a verdict (the client went away)."""
        self.probing = False


def retryable(chunk: Any) -> str | None:
    """Why a first chunk means the engine did not serve (a server-side error: 5xx), or None."""
    first = chunk[0] if isinstance(chunk, list) and chunk else chunk
    if isinstance(first, ErrorResponse) and (first.error.code or 500) >= 500:
        return f"HTTP {first.error.code}: {first.error.message[:200]}"
    return None


async def attempt(
    method: Any, args: tuple[Any, ...], wait_s: float, first_s: float | None = None
) -> AsyncGenerator[Any, None]:
    """One engine's stream for ``args`` through ``method`` (a streaming handle's method), raising
    ``Refused`` before its first chunk when no replica takes it within ``wait_s`` (Serve's
    ``choose_replica`` bounds the router's wait and nothing else), its first chunk is a server
    error, the replica dies first, or (``first_s``) that chunk takes longer."""
    manager = method.choose_replica(*args)
    try:
        selection = await asyncio.wait_for(manager.__aenter__(), wait_s)
    except TimeoutError:
        raise Refused(f"no replica within {wait_s:g} s") from None
    except Exception as error:  # DeploymentUnavailableError, a replica that died while chosen
        raise Refused(f"{type(error).__name__}: {error}"[:300]) from None
    failure: tuple[Any, Any, Any] = (None, None, None)
    try:
        stream = method.dispatch(selection, *args)
        try:
            first = await asyncio.wait_for(stream.__anext__(), first_s)
        except StopAsyncIteration:
            raise Refused("ended before its first chunk") from None
        except TimeoutError:
            stream.cancel()
            raise Refused(f"no answer within {first_s:g} s") from None
        except Exception as error:  # the replica or its engine died before answering
            raise Refused(f"{type(error).__name__}: {error}"[:300]) from None
        reason = retryable(first)
        if reason is not None:
            async for _ in stream:  # drained inside the selection, as Serve asks
                pass
            raise Refused(reason)
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


def _method(request: Any) -> str:
    if isinstance(request, ChatCompletionRequest):
        return "chat"
    if isinstance(request, CompletionRequest):
        return "completions"
    raise ValueError(f"Unsupported request type: {type(request)}")


class FailoverPrefillServer(PDPrefillServer):  # type: ignore[misc]
    """Ray's prefill server; a request without ``kv_transfer_params`` (the ingress's fallback) is
    served whole by its engine, as any LLMServer serves it."""


class FailoverDecodeServer(PDDecodeServer):  # type: ignore[misc]
    """Ray's decode orchestrator, prefilling locally when prefill cannot, or when the prompt is short."""

    async def __init__(  # type: ignore[misc]  # Serve's async constructor, as Ray's PDDecodeServer has
        self, llm_config: Any, *, prefill_server: Any, failover: dict[str, Any], **kwargs: Any
    ) -> None:
        self._failover = Failover.parse(failover)
        self._prefill = Breaker("prefill")
        self._paths = _Counter()
        await super().__init__(llm_config, prefill_server=prefill_server, **kwargs)

    async def _prompt_tokens(self, request: Any) -> int | None:
        """The prompt's length by this engine's tokenizer (chat template included), None if unknown.
        Ray's ``tokenize`` is refused for generation models ("does not support the 'tokenization'
        task"), so the tokenizer is vLLM's own, from the engine client."""
        try:
            tokenizer = self.engine._engine_client.tokenizer
            if isinstance(request, ChatCompletionRequest):
                messages = [m if isinstance(m, dict) else m.model_dump() for m in request.messages]
                text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            elif isinstance(request.prompt, str):
                text = request.prompt
            else:  # token ids, or several prompts: the standard path
                return None
            return len(tokenizer.encode(text, add_special_tokens=False))
        except Exception:  # unknown length: the standard path
            return None

    async def _local(self, method: str, request: Any, raw: Any, path: str) -> AsyncGenerator[Any, None]:
        self._paths.count(path)
        async for chunk in await getattr(LLMServer, method)(self, request, raw):
            yield chunk

    async def _pd_handle_request(self, request: Any, raw_request_info: Any = None) -> AsyncGenerator[Any, None]:
        method = _method(request)
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
        backend = self._get_connector_backend()
        prefill_request = backend.prepare_prefill_request(request=request, peer=None)
        self._request_prefill_token_ids(prefill_request)
        prefill = getattr(self._prefill_handle, method)
        chunks = attempt(prefill, (prefill_request, raw_request_info), failover.wait_s, failover.prefill_timeout_s)
        try:
            try:
                prefill_chunk = await chunks.__anext__()
            except Refused as refused:
                self._prefill.failed(str(refused))
                prefill_chunk = None
            except StopAsyncIteration:
                self._prefill.failed("no answer")
                prefill_chunk = None
            except BaseException:
                self._prefill.released()
                raise
            if prefill_chunk is None or isinstance(prefill_chunk, ErrorResponse):
                if isinstance(prefill_chunk, ErrorResponse):  # a 4xx: the request itself, decode says the same
                    self._prefill.succeeded()
                async for chunk in self._local(method, request, raw_request_info, "local_prefill"):
                    yield chunk
                return
            self._prefill.succeeded()
            async for _ in chunks:  # prefill answers one token: drained inside its selection
                pass
        finally:
            await chunks.aclose()
        self._paths.count("disaggregated")
        decode_request = backend.prepare_decode_request(request=request, peer=None, prefill_response=prefill_chunk)
        from ray.llm._internal.common.patches.vllm.tokenize_once import reuse_prompt_token_ids

        with reuse_prompt_token_ids(self._decode_reuse_ids(prefill_chunk)):
            async for chunk in await getattr(LLMServer, method)(self, decode_request, raw_request_info):
                yield chunk


class FailoverIngress(OpenAiIngress):  # type: ignore[misc]
    """Ray's OpenAI ingress, sending a request whole to the prefill engine when decode cannot take it."""

    def __init__(
        self,
        llm_deployments: dict[str, Any],
        model_cards: dict[str, Any],
        *,
        prefill_servers: dict[str, Any],
        failover: dict[str, Any],
        **kwargs: Any,
    ) -> None:
        super().__init__(llm_deployments, model_cards, **kwargs)
        self._failover = Failover.parse(failover)
        self._whole = {model: handle.options(stream=True) for model, handle in prefill_servers.items()}
        self._decode = Breaker("decode")
        self._paths = _Counter()

    async def _get_response(self, *, body: Any, call_method: str, raw_request: Any = None) -> AsyncGenerator[Any, None]:
        if call_method not in ("chat", "completions"):
            async for chunk in super()._get_response(body=body, call_method=call_method, raw_request=raw_request):
                yield chunk
            return
        model_id = await self._get_model_id(body.model)
        decode = self._get_configured_serve_handle(model_id)
        whole = self._whole[model_id.split(":", 1)[0]]
        if raw_request is not None:
            from ray.serve._private.http_util import session_id_from_headers

            session_id = session_id_from_headers(raw_request.headers)
            if session_id:
                decode, whole = decode.options(session_id=session_id), whole.options(session_id=session_id)
        if isinstance(body, ChatCompletionRequest):
            from ray.llm._internal.serve.core.ingress.utils import _sanitize_chat_completion_request

            body = _sanitize_chat_completion_request(body)
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
                reasons.append(f"decode: {refused}")
        try:
            chunks = attempt(getattr(whole, call_method), (body, raw), wait_s)
            first = await chunks.__anext__()
        except Refused as refused:
            reasons.append(f"prefill: {refused}")
            self._paths.count("refused")
            logger.warning("%s: refused a request (HTTP 503): %s", FALLBACK_LINE, "; ".join(reasons))
            yield ErrorResponse(error=ErrorInfo(message=REFUSAL.format(int(COOLDOWN_S)), type=REFUSED_TYPE, code=503))
            return
        self._paths.count("prefill_whole")
        yield first
        async for chunk in chunks:
            yield chunk

    @staticmethod
    async def _first_then_rest(chunks: AsyncGenerator[Any, None], breaker: Breaker) -> AsyncGenerator[Any, None]:
        """``chunks``, the breaker told how the first one went (decode counts its own path)."""
        try:
            first = await chunks.__anext__()
        except Refused:
            raise
        except BaseException:
            breaker.released()
            raise
        breaker.succeeded()
        yield first
        async for chunk in chunks:
            yield chunk

    async def _process_llm_request(self, body: Any, call_method: str, raw_request: Any = None) -> Response:
        """Ray's, with the refusal as HTTP 503 and ``Retry-After`` (Ray's error path sets no header)."""
        try:
            return await super()._process_llm_request(body, call_method, raw_request)
        except OpenAIHTTPException as error:
            if error.status_code != 503 or error.type != REFUSED_TYPE:
                raise
            return JSONResponse(
                status_code=503,
                content={"error": {"message": error.message, "type": REFUSED_TYPE, "code": 503}},
                headers={"Retry-After": str(int(COOLDOWN_S))},
            )


def build_failover_app(args: dict[str, Any]) -> Any:
    """The serve application: Ray's PD graph with the failover above (same deployments' names)."""
    args = dict(args)
    failover = Failover.parse(args.pop(ARGS_KEY, None))
    pd = PDServingArgs.model_validate(args)
    for config in (pd.prefill_config, pd.decode_config):
        if config.engine_kwargs.get("data_parallel_size", 1) > 1:
            raise ValueError("eks_pd_failover: data_parallel_size above 1 is not supported; use build_pd_openai_app")
    prefill = build_llm_deployment(pd.prefill_config, name_prefix="Prefill:", deployment_cls=FailoverPrefillServer)
    decode = build_llm_deployment(
        pd.decode_config,
        name_prefix="Decode:",
        bind_kwargs={"prefill_server": prefill, "failover": failover.as_args()},
        deployment_cls=FailoverDecodeServer,
    )
    options = maybe_apply_llm_deployment_config_defaults(
        FailoverIngress.get_deployment_options([pd.decode_config]), pd.ingress_deployment_config
    )
    # Ray's ingress deployment's name (its class's), so dashboards and alarms see the same deployments.
    options = {"name": INGRESS_NAME, **options}
    model_id = pd.decode_config.model_id
    return serve.deployment(make_fastapi_ingress(FailoverIngress), **options).bind(
        llm_deployments={model_id: decode},
        model_cards={model_id: to_model_metadata(model_id, pd.decode_config)},
        prefill_servers={model_id: prefill},
        failover=failover.as_args(),
    )
