"""Command-line tool: one module a command (``preflight``, ``sizing_cmd`` for sizing, ``cost``,
``verify``, ``k8s_diff`` for k8s-diff, ``impact``); ``_common`` holds the settings arguments and the
tables they print. ``DESCRIPTION`` is what ``--help`` tells its users."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from ..config import ConfigError

DESCRIPTION = """Know before you deploy, prove after: the checks and estimates around `cdk deploy`.

  before:  preflight (your AWS account), sizing (the model on the GPU), cost (what it runs)
  review:  k8s-diff and impact (what a change does to the running service, beside `cdk diff`)
  after:   verify (the deployed cluster serves as designed)

preflight, sizing and verify read the settings `cdk synth` reads (cdk.json, -c key=value); cost,
k8s-diff and impact read what it wrote (cdk.out).

Exit codes: 0 every check passed (k8s-diff, impact: nothing changed), 1 a check failed (k8s-diff,
impact: something changed), 2 bad usage or configuration."""

# Each command is a module with a docstring, ``add_arguments`` and ``run``. They are imported when
# the parser is built, not with this package: synth imports ``sizing_cmd`` alone. None of them
# imports aws_cdk or cdk8s at the top, so no command starts jsii's Node process to parse its
# arguments (a test holds this).
COMMANDS = {
    "preflight": "preflight",
    "sizing": "sizing_cmd",
    "cost": "cost",
    "verify": "verify",
    "k8s-diff": "k8s_diff",
    "impact": "impact",
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eks_pd_serving", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    commands = parser.add_subparsers(dest="command", required=True)
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(f"{__name__}.{module_name}")
        doc = module.__doc__ or ""
        sub = commands.add_parser(name, help=doc.splitlines()[0], description=doc,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
