"""Generate the fault table of docs/development/rehearsals.md from the fault rehearsal's registry
(``rehearsal/faults/registry.py``): each fault's ``--faults`` name, what it injects, how it heals
and what it must show, in the order a run injects them (``--check``: exit 1 if the page differs)."""

from __future__ import annotations

import sys
from pathlib import Path

from rehearsal.faults.registry import FAULTS
from tools.generated import Section


def table() -> str:
    rows = ["| `--faults` | what it injects | how it heals | what it must show |", "| --- | --- | --- | --- |"]
    rows += [f"| `{f.key}` | {f.injects} | {f.heals} | {f.shows} |" for f in FAULTS]
    return "\n".join(rows)


PAGE = Path(__file__).resolve().parents[1] / "docs" / "development" / "rehearsals.md"
SECTION = Section(PAGE, "fault table", "the registry", "tools.fault_reference", table)


def main(argv: list[str] | None = None) -> int:
    return SECTION.main(argv, __doc__)


if __name__ == "__main__":
    sys.exit(main())
