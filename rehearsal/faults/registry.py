"""The faults, in the order a run injects them. Adding a fault is a file of its own (a ``Fault``)
and one line here."""

from __future__ import annotations

from typing import Any

from . import gcs, hostile, kv, new_disk, poison, replace, replica, update
from .fault import Fault

FAULTS: tuple[Fault, ...] = (
    hostile.FAULT,  # first: it must find every engine process as it started
    replica.DECODE,
    poison.FAULT,
    replica.PREFILL,
    new_disk.FAULT,
    kv.FAULT,
    replace.FAULT,
    update.FAULT,
    gcs.FAULT,  # last: without a store, a dead GCS takes every Ray process with it
)
KEYS = tuple(f.key for f in FAULTS)
_BY_KEY = {f.key: f for f in FAULTS}


def unit_of(key: str) -> Fault | None:
    """The fault a judged key (``update:<change>`` included) belongs to; None for a key no fault has."""
    return _BY_KEY.get(key.split(":", 1)[0])


def chosen(keys: tuple[str, ...]) -> tuple[Fault, ...]:
    return tuple(f for f in FAULTS if f.key in keys)


def fault_key(title: str) -> str:
    """A fault's key from its display title, for events recorded before faults carried keys (the
    longest title start that matches: the runbook's title starts like a decode kill's)."""
    starts = {start: key for fault in FAULTS for start, key in fault.titles}
    match = max((s for s in starts if title.startswith(s)), key=len, default=None)
    return starts[match] if match is not None else title


def key_of(record: dict[str, Any]) -> str:
    """The judged fault's key (its own, or read from an older recording's title)."""
    return str(record.get("key") or fault_key(record["fault"]))
