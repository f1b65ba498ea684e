"""What a change does to the running deployment: the reviewer's companion to `cdk diff`.

For two synthesized assemblies (cdk.out folders, or template files), per changed resource:
add, modify in place, replace or delete (replacement from the create-only properties of
CloudFormation's resource schemas, as cfn-lint ships them, followed through references), what
it does to the running service in one line, the Kubernetes objects each manifest update creates,
changes, prunes or leaves in the cluster, and the order of the cleanup phase's deletes. It also
runs the lifecycle rules over the new template and over the pair.
Exit 0 when nothing changed, 1 when something did, 2 on bad usage.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..assembly import templates
from ..lifecycle.changes import Impact, compare
from ..lifecycle.graph import StackModel
from ..lifecycle.rules import UPDATE_RULES, Finding, check
from ._common import console, table

_VERBS = {"add": "add", "modify": "modify in place", "replace": "REPLACE", "delete": "delete"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("old", type=Path, help="cdk.out folder (or template) before")
    parser.add_argument("new", type=Path, help="cdk.out folder (or template) after")


def report(stack: str, impact: Impact, findings: list[Finding]) -> None:
    rows = [[_VERBS[c.action], c.resource, c.type.split("::", 1)[-1], c.effect, c.cause] for c in impact.changes]
    console.print(table(f"{stack}: resources", ["action", "resource", "type", "what it does", "why"], rows))
    if impact.objects:
        rows = [[o.action, o.object, o.resource, o.effect] for o in impact.objects]
        console.print(table(f"{stack}: Kubernetes objects", ["action", "object", "manifest", "what it does"], rows))
    if impact.cleanup:
        console.print(f"{stack}: cleanup phase deletes, in order: {', '.join(impact.cleanup)}", markup=False)
    for finding in findings:
        console.print(f"{stack}: lifecycle rule broken: {finding}", markup=False)


def run(args: argparse.Namespace) -> int:
    for path in (args.old, args.new):
        if not path.exists():
            console.print(f"error: {path} not found. Fix: synthesize it first (make synth, or cdk synth -o <dir>)")
            return 2
    old, new = templates(args.old), templates(args.new)
    if not old or not new:
        console.print("error: no *.template.json found. Fix: pass cdk.out folders or template files")
        return 2
    changed = 0
    for stack in sorted(set(old) | set(new)):
        if stack not in old or stack not in new:
            console.print(f"{stack}: stack {'added' if stack in new else 'removed'}", markup=False)
            changed += 1
            continue
        before, after = StackModel(old[stack]), StackModel(new[stack])
        impact = compare(before, after)
        findings = check(after) + [f for rule in UPDATE_RULES.values() for f in rule(before, after)]
        if impact.empty:
            console.print(f"{stack}: no change", markup=False)
            continue
        changed += len(impact.changes)
        report(stack, impact, findings)
    console.print(f"{changed} change(s)" if changed else "no change")
    return 1 if changed else 0
