"""A new node's disk: the node's compile caches removed, then the prefill replica killed. With the
compile caches shared through the bucket (``shared_compile_cache``, on by default), the replica that
Serve starts extracts the archive the first start shared before its engine starts, so its engine
compiles nothing again; its split's ``compile_caches`` says what it extracted, beside its
``engine_init`` (docs/features/cold-start.md)."""

from __future__ import annotations

import shutil
import time
from typing import Any

from eks_pd_serving.k8s import serve_config as layout
from eks_pd_serving.phase import Phase

from .. import profile
from ..harness import log
from .fault import Context, kill
from .replica import ReplicaKilled

REMOVED = "compile caches removed, prefill replica killed"
# How long the fault waits for the first start's share (its mark beside the folders) before it
# removes them: the upload runs after the engine started, in the background.
SHARE_WAIT_S = 180.0
_EXTRACTED = " files from s3://"  # eks_pd_node_cache.fill_compiled's line when it extracted


def compile_root() -> Any:
    return profile.LOCAL_NODE_CACHE / "compile"


class NewDisk(ReplicaKilled):
    def __init__(self) -> None:
        super().__init__("prefill", "after its node's compile caches are removed", in_flight_may_fail=True)
        self.key = "new-disk"
        self.injects = "the node's compile caches removed (a new node's disk), then SIGKILL to the prefill replica"
        self.heals = "Serve starts a new prefill replica, which extracts the compile caches the first start shared"
        self.shows = (
            "at most the requests in flight at the kill fail; the new replica's engine starts from the shared "
            "compile caches (its split's compile_caches line says how many files it extracted)"
        )
        self.titles = ((REMOVED, "new-disk"),)

    def run(self, context: Context) -> None:
        root = compile_root()
        end = time.time() + SHARE_WAIT_S
        while time.time() < end and not list(root.glob("*/.shared-*")):
            time.sleep(2.0)
        log(f"== new disk: shared marks {sorted(p.name for p in root.glob('*/.shared-*'))}")
        title = layout.replica_title(context.rehearsed, Phase.PREFILL)

        def inject() -> list[int]:
            shutil.rmtree(root, ignore_errors=True)
            return kill(context.run_id, title)

        context.inject(self.key, REMOVED, inject)

    def holds(self, judged: dict[str, Any], report: dict[str, Any]) -> bool:
        """The new prefill replica extracted the shared compile caches before its engine started."""
        starts = judged.get("replica_start") or []
        return any(
            _EXTRACTED in str(s.get("compile_caches") or "") for s in starts if s["deployment"].startswith("Prefill")
        )


FAULT = NewDisk()
