"""Command-line tool: know before you deploy, prove after.

Exit codes: 0 every check passed (k8s-diff, impact: nothing changed), 1 a check failed (k8s-diff,
impact: something changed), 2 bad usage or configuration.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from ..config import ConfigError
from . import cost, impact, k8s_diff, preflight, sizing_cmd, verify

COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "preflight": (preflight.__doc__ or "", preflight.add_arguments, preflight.run),
    "sizing": (sizing_cmd.__doc__ or "", sizing_cmd.add_arguments, sizing_cmd.run),
    "cost": (cost.__doc__ or "", cost.add_arguments, cost.run),
    "verify": (verify.__doc__ or "", verify.add_arguments, verify.run),
    "k8s-diff": (k8s_diff.__doc__ or "", k8s_diff.add_arguments, k8s_diff.run),
    "impact": (impact.__doc__ or "", impact.add_arguments, impact.run),
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eks_pd_serving", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    commands = parser.add_subparsers(dest="command", required=True)
    for name, (doc, add_arguments, run) in COMMANDS.items():
        sub = commands.add_parser(name, help=doc.splitlines()[0], description=doc,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
        add_arguments(sub)
        sub.set_defaults(run=run)
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
