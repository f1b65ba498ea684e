"""A catalogue model's shape for the GPU rehearsal, built offline: its own config.json (the
verbatim copy in eks_pd_serving/catalog/configs/) and the toy tokenizer, served with
``load_format: dummy`` (vLLM fills weights of the real shape). Only the special-token ids change,
to the toy tokenizer's; sizing reads nothing of them.
"""

from __future__ import annotations

import json
from pathlib import Path

from eks_pd_serving.catalog import CATALOG, CONFIGS

from . import tiny_checkpoint


def build(out: Path, model_source: str) -> Path:
    """Write ``model_source``'s config and the toy tokenizer into ``out`` (idempotent)."""
    if (out / "config.json").exists():
        return out
    if model_source not in CATALOG:
        raise ValueError(f"{model_source!r} has no config.json in the catalogue; use one of {', '.join(CATALOG)}")
    out.mkdir(parents=True, exist_ok=True)
    eos_id = tiny_checkpoint.build_tokenizer(out)
    config = json.loads((CONFIGS / CATALOG[model_source].config).read_text())
    config.update(eos_token_id=eos_id, bos_token_id=0, pad_token_id=0)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos_id}))
    return out
