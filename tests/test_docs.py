"""The settings reference is generated from the model and held to it; each default is written once."""

from __future__ import annotations

from pathlib import Path

import pytest

from eks_pd_serving.config.settings import Settings
from tools import settings_reference


def test_the_committed_settings_reference_is_what_the_model_generates() -> None:
    assert settings_reference.TARGET.read_text() == settings_reference.render()


def test_the_check_fails_on_a_stale_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stale = tmp_path / "settings.md"
    stale.write_text(settings_reference.render().replace("`ray-llm-multinode`", "`ray-llm`"))
    monkeypatch.setattr(settings_reference, "TARGET", stale)
    assert settings_reference.main(["--check"]) == 1
    stale.write_text(settings_reference.render())
    assert settings_reference.main(["--check"]) == 0


def test_every_setting_is_in_the_reference_under_a_section() -> None:
    sections = settings_reference.sections()
    assert set(sections) == set(Settings.model_fields) and all(sections.values())
    assert {"cluster and network", "observability", "serving"} <= set(sections.values())


@pytest.mark.parametrize("name", sorted(Settings.model_fields))
def test_each_default_is_written_once(name: str) -> None:
    field = Settings.model_fields[name]
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    # The value documents itself; a description never repeats it (the copies drifted before).
    assert "Default:" not in (field.description or "")
    if field.default is None:
        assert extra.get("default_means"), f"{name}: say what an unset value does (means=...)"
    else:
        assert "default_means" not in extra
