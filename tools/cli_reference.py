"""Generate the command table of docs/reference/cli.md from the CLI itself: each command's name as
``python -m eks_pd_serving`` takes it and its module docstring's first line, in the parser's order
(``--check``: exit 1 if the page differs)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from eks_pd_serving.cli import COMMANDS
from tools.generated import Section


def table() -> str:
    rows = ["| command | what it answers |", "| --- | --- |"]
    for name, module in COMMANDS.items():
        doc = importlib.import_module(f"eks_pd_serving.cli.{module}").__doc__ or ""
        rows.append(f"| [`{name}`](#{name}) | {doc.strip().splitlines()[0]} |")
    return "\n".join(rows)


PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "cli.md"
SECTION = Section(PAGE, "command table", "the CLI", "tools.cli_reference", table)


def main(argv: list[str] | None = None) -> int:
    return SECTION.main(argv, __doc__)


if __name__ == "__main__":
    sys.exit(main())
