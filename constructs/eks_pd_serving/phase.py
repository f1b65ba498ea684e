"""The two phases of a disaggregated pair, as one enum every layer shares (settings, layout, serve
config, GPU accounting, the CLI). A ``StrEnum``: a phase is its value wherever text is written
(Kubernetes labels, Serve application names, JSON, YAML through ``str``), and a value read back
from text (a label, a serve config) is turned into a phase once, by ``Phase(text)``, which refuses
anything else. Dependency-free: the pod programs' packages and the rehearsals import it too."""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"

    @property
    def kv_role(self) -> str:
        """vLLM's KV role (vLLM >= 0.30 deprecates kv_both for NixlConnector): prefill produces,
        decode consumes."""
        return "kv_producer" if self is Phase.PREFILL else "kv_consumer"

    @property
    def other(self) -> Phase:
        return Phase.DECODE if self is Phase.PREFILL else Phase.PREFILL


#: In the order a pair starts and a request flows: prefill, then decode.
PHASES: tuple[Phase, ...] = tuple(Phase)
