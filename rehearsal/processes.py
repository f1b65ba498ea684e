"""The processes of one rehearsal run: each carries the run's marker in its environment (set
before Ray starts, inherited by the raylet, workers and the engines they spawn), so a run finds
and stops its own and never another's."""

from __future__ import annotations

import contextlib
import os
from typing import Any

MARKER = "EKS_PD_REHEARSAL_RUN"


def marked_processes(run_id: str, *titles: str) -> list[Any]:
    """This run's processes (psutil), but this one; with ``titles``, those whose command line
    contains one of them."""
    import psutil

    me, found = os.getpid(), []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            line = " ".join(proc.cmdline())
            if (
                proc.pid != me
                and proc.environ().get(MARKER) == run_id
                and (not titles or any(t in line for t in titles))
            ):
                found.append(proc)
    return found
