"""The decode replica replaced by the runbook's program for a broken KV link (what an operator runs
in the head's container: ``eks_pd_serving.fault_tolerance.runbook``)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from eks_pd_serving.fault_tolerance import runbook

from .fault import Context, Fault

REPLACED = "decode replica replaced by the runbook's command"


def _replace_decode() -> list[str]:
    """The runbook's program (docs/features/failures.md), run as the operator runs it in the head's
    container: a driver of its own on the cluster's Ray."""
    ran = subprocess.run([sys.executable, "-c", runbook.REPLACE_DECODE], capture_output=True, text=True,
                         timeout=120, check=False)  # fmt: skip
    if ran.returncode != 0:
        raise RuntimeError(f"the runbook's program failed: {ran.stderr.strip()[-300:]}")
    (line,) = [line for line in ran.stdout.splitlines() if line.startswith(runbook.REPLACED_LINE)]
    return list(json.loads(line.removeprefix(runbook.REPLACED_LINE)))


class RunbookReplace(Fault):
    key = "replace"
    injects = "the runbook's program for a broken KV link, run as a driver on the cluster's Ray"
    heals = "Serve starts the new decode replica the program asked for"
    shows = "the program found a decode replica to replace, and the app serves again within the bound"
    titles = ((REPLACED, "replace"),)

    def run(self, context: Context) -> None:
        context.inject(self.key, REPLACED, _replace_decode)

    def holds(self, judged: dict[str, Any], report: dict[str, Any]) -> bool:
        return bool(judged["killed"])


FAULT = RunbookReplace()
