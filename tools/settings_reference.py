"""Generate docs/reference/settings.md from the settings model: every setting's section, default
and description, written once in constructs/eks_pd_serving/config/settings.py.

    .venv/bin/python -m tools.settings_reference          # rewrite the file
    .venv/bin/python -m tools.settings_reference --check  # exit 1 if the file differs
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from eks_pd_serving.config.settings import SECTIONS, Settings
from tools.generated import write_or_check

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "docs" / "reference" / "settings.md"


def sections() -> dict[str, str]:
    """setting -> its section (``SECTIONS`` in settings.py), in the reference's order."""
    return {name: section for section, names in SECTIONS.items() for name in names}


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def default_text(name: str) -> str:
    field = Settings.model_fields[name]
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    if field.default is None:
        return str(extra.get("default_means", "none"))
    if field.default == ():
        return "none (an empty list)"
    return f"`{_literal(field.default)}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    lines = [
        "# Settings reference",
        "",
        "Generated from `constructs/eks_pd_serving/config/settings.py` by `python -m tools.settings_reference`;",
        "do not edit (a test fails when this file and the model differ). Every setting is a `cdk.json`",
        "context key, a `-c key=value` override, or a keyword of `DeploymentConfig.create(...)`.",
    ]
    by_section: dict[str, list[str]] = {}
    for name, section in sections().items():
        by_section.setdefault(section, []).append(name)
    for section, names in by_section.items():
        lines += [
            "",
            f"## {section}",
            "",
            "| setting | default | what it does | valid values |",
            "| --- | --- | --- | --- |",
        ]
        for name in names:
            field = Settings.model_fields[name]
            extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
            row = [f"`{name}`", default_text(name), field.description or "", str(extra.get("hint", ""))]
            lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return write_or_check(argv, __doc__, TARGET, render, "python -m tools.settings_reference")


if __name__ == "__main__":
    sys.exit(main())
