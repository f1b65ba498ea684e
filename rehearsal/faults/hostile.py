"""Hostile requests beside the clients' load: what a client may not send, sent while others are served.

Through the endpoint: the orchestrator's transfer fields at the top level and nested in
``vllm_xargs`` as every JSON type, on both routes; a request's own chat template. Each must be
refused (400, naming the field) before any engine reads it. Then past the ingress, straight to each
engine's own server through Serve's handles (what ``prefill_whole`` and decode's paths receive): the
same nested fields must be cleared there, and the engine must answer. No replica or engine process
may restart, and no client request may fail."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from eks_pd_serving.k8s import serve_config as layout
from eks_pd_serving.phase import PHASES

from ..client_limits import NESTED_VALUES, serving_processes
from ..probes import _chat_body
from .fault import Context, Fault

FIELDS = ("kv_transfer_params", "ec_transfer_params")


class HostileRequests(Fault):
    key = "hostile"
    injects = (
        "requests carrying the orchestrator's transfer fields (top level, and in vllm_xargs as every JSON type) "
        "and their own chat templates, through the endpoint and straight to each engine's server"
    )
    heals = "nothing to heal"
    shows = (
        "every such request refused at the ingress with HTTP 400 naming the field; each engine's server clears "
        "them and answers; no replica or engine process restarts and no client request fails"
    )
    titles = (("hostile requests", "hostile"),)

    def run(self, context: Context) -> None:
        seen: dict[str, Any] = {}

        def inject() -> list[int]:
            seen["processes_before"] = serving_processes(context.run_id)
            seen["ingress"] = _through_ingress(context)
            seen["engines"] = asyncio.run(_straight_to_engines(context))
            time.sleep(5.0)  # an engine core that died would be gone by now
            seen["processes_after"] = serving_processes(context.run_id)
            return []

        context.inject(self.key, "hostile requests", inject)
        context.events.write({"type": "probe", "key": self.key, "at": time.time(), "seen": seen})

    def holds(self, judged: dict[str, Any], report: dict[str, Any]) -> bool:
        seen = (judged.get("probes") or [{}])[0].get("seen", {})
        if not seen:
            return False
        # vLLM's own request model refuses some types (null, an object) before the allowlist reads them:
        # 400 either way; the allowlist names the field wherever the model took the request.
        model_refused = {k.split(" ", 1)[1] for k, v in seen["engines"].items() if v == "not a request"}
        ingress_ok = all(
            v["status"] == 400 and (v["param"] == v["expected"] or name.split(" ", 1)[1] in model_refused)
            for name, v in seen["ingress"].items()
        )
        engines = list(seen["engines"].values())
        engines_ok = "answered" in engines and all(v in ("answered", "not a request") for v in engines)
        same = bool(seen["processes_before"]) and seen["processes_before"] == seen["processes_after"]
        return ingress_ok and engines_ok and same

    def failover_holds(self, judged: dict[str, Any], wait_s: float) -> bool:
        return bool(judged["requests_failed"] == 0)


def _bodies(context: Context) -> dict[str, tuple[str, dict[str, Any], str]]:
    """name: (route, body, the param its refusal must name)."""
    chat = _chat_body(context.endpoint, "The quick brown fox", max_tokens=4)
    completion = {"model": context.endpoint.model_id, "prompt": "The quick brown fox", "max_tokens": 4}
    found: dict[str, tuple[str, dict[str, Any], str]] = {}
    for route, body in (("/v1/chat/completions", chat), ("/v1/completions", completion)):
        for field in FIELDS:
            found[f"{route} {field}"] = (route, {**body, field: {"do_remote_prefill": True}}, field)
            for kind, value in NESTED_VALUES.items():
                found[f"{route} vllm_xargs.{field} {kind}"] = (
                    route, {**body, "vllm_xargs": {field: value}}, f"vllm_xargs.{field}",
                )  # fmt: skip
    found["chat_template"] = ("/v1/chat/completions", {**chat, "chat_template": "{{ 'x' * 9 }}"}, "chat_template")
    return found


def _through_ingress(context: Context) -> dict[str, Any]:
    found = {}
    with context.endpoint.client(60) as client:
        for name, (route, body, param) in _bodies(context).items():
            answer = client.post(route, json=body)
            error = (answer.json().get("error") or {}) if answer.status_code != 200 else {}
            found[name] = {"status": answer.status_code, "param": error.get("param"), "expected": param}
    return found


async def _straight_to_engines(context: Context) -> dict[str, str]:
    """Each engine's server called with the nested fields, as the failover's own paths call them:
    decode's orchestrator (disaggregated or short) and prefill serving a request whole."""
    from ray import serve
    from ray.llm._internal.serve.core.configs.openai_api_models import ChatCompletionRequest, ErrorResponse

    found: dict[str, str] = {}
    for phase in reversed(PHASES):
        app = next(a["name"] for a in context.rehearsed["applications"] if a["name"].endswith(f"-{phase}"))
        model = layout.llm_config(context.rehearsed, phase)["model_loading_config"]["model_id"]
        handle = serve.get_deployment_handle(layout.deployment_name(phase, model), app).options(stream=True)
        for field in FIELDS:
            for kind, value in NESTED_VALUES.items():
                try:
                    request = ChatCompletionRequest(
                        model=model, messages=[{"role": "user", "content": "The quick brown fox"}], max_tokens=4,
                        vllm_xargs={field: value},
                    )  # fmt: skip
                except ValueError:  # vLLM's own request model refuses this type: it reaches no engine
                    found[f"{phase} vllm_xargs.{field} {kind}"] = "not a request"
                    continue
                chunks = [chunk async for chunk in handle.chat.remote(request, None)]
                first = chunks[0] if chunks else None
                first = first[0] if isinstance(first, list) and first else first
                found[f"{phase} vllm_xargs.{field} {kind}"] = (
                    f"error {first.error.code}: {first.error.message[:120]}"
                    if isinstance(first, ErrorResponse)
                    else "answered"
                )
    return found


FAULT = HostileRequests()
