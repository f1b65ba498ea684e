"""The one command shape of the generated docs: write the page, or ``--check`` that it is current."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def write_or_check(argv: list[str] | None, doc: str | None, target: Path, render: Callable[[], str], fix: str) -> int:
    """``render()`` into ``target``; with ``--check``, exit 1 with one line naming ``fix`` when
    the committed file differs."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed file differs")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not target.exists() or target.read_text() != text:
            print(f"{target.name} is out of date. Fix: {fix}", file=sys.stderr)
            return 1
        return 0
    target.write_text(text)
    print(f"wrote {target}")
    return 0


def between_markers(page: str, begin: str, end: str, body: str, name: str) -> str:
    """``page`` with what lies between ``begin`` and ``end`` replaced by ``body`` (the markers must
    be there: one line naming them otherwise)."""
    if begin not in page or end not in page:
        raise ValueError(f"{name} lacks its generated section's markers. Fix: put {begin} and {end} in it")
    head, rest = page.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}\n{end}{tail}"
