"""The models a deployment serves, as the settings name them: the first from ``model_id``,
``model_source`` and ``model_revision``, each further one an entry of ``served_models``
(``model_id=repository@revision``). One typed value per model (``ModelChoice``), parsed once when
the settings are validated; the mapping builds each model's ``k8s.ServedModel`` from it."""

from __future__ import annotations

import re
from dataclasses import dataclass

# A model id without spaces or "=", a Hugging Face repository (owner/name), and a revision.
_ENTRY = re.compile(r"^(?P<id>[A-Za-z0-9][\w.:-]*)=(?P<repo>[\w.-]+/[\w.-]+)(?:@(?P<rev>[\w./-]+))?$")
FORM = "model_id=repository@revision, such as qwen3-8b=Qwen/Qwen3-8B@main (no @revision: main)"
#: Each served model's phases take a window of their phase's NIXL ports (k8s.serve_config): at most
#: this many models in one RayService.
MOST_MODELS = 10
#: The first model's Serve applications' prefix (pd-prefill, pd-decode): kept across versions.
FIRST_APP_PREFIX = "pd"


@dataclass(frozen=True)
class ModelChoice:
    """One served model: the id clients send, its Hugging Face repository and the revision served
    (a commit hash pins it; a branch or tag is resolved when staged)."""

    model_id: str
    repository: str
    revision: str = "main"

    @classmethod
    def parse(cls, text: str) -> ModelChoice:
        found = _ENTRY.match(text.strip())
        if not found:
            raise ValueError(f"{text!r} is not {FORM}")
        return cls(found["id"], found["repo"], found["rev"] or "main")

    def __str__(self) -> str:
        return f"{self.model_id}={self.repository}@{self.revision}"

    @property
    def own_app_prefix(self) -> str:
        """A further model's Serve applications' prefix (``<prefix>-prefill``, ``<prefix>-decode``):
        the model id in lower case with anything but letters, digits and hyphens as a hyphen."""
        return re.sub(r"[^a-z0-9-]+", "-", self.model_id.lower()).strip("-")


def app_prefixes(models: tuple[ModelChoice, ...]) -> tuple[str, ...]:
    """Each served model's Serve applications' prefix, in order: ``FIRST_APP_PREFIX``, then each
    further model's own."""
    return tuple(FIRST_APP_PREFIX if index == 0 else m.own_app_prefix for index, m in enumerate(models))
