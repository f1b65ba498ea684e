"""The whole default template, byte for byte, against the committed snapshot: a refactor must
not move a logical id or a property. A deliberate change is reviewed, then recorded with
UPDATE_SNAPSHOTS=1 make test (and the diff reads in `git diff`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from support import ROOT

SNAPSHOT = ROOT / "tests" / "__snapshots__" / "template.json"


def normalized(template_file: Path) -> str:
    template = json.loads(template_file.read_text())
    # aws-cdk-lib's version report, not ours.
    template["Resources"].pop("CDKMetadata", None)
    template.get("Conditions", {}).pop("CDKMetadataAvailable", None)
    return json.dumps(template, indent=1, sort_keys=True) + "\n"


def test_default_template_matches_the_snapshot(template_file: Path) -> None:
    rendered = normalized(template_file)
    if os.environ.get("UPDATE_SNAPSHOTS") or not SNAPSHOT.exists():
        SNAPSHOT.write_text(rendered)
    assert rendered == SNAPSHOT.read_text(), "template changed: review, then UPDATE_SNAPSHOTS=1 make test"
