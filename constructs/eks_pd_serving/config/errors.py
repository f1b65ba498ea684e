"""The one error type of the configuration."""

from __future__ import annotations


class ConfigError(ValueError):
    """A setting (or a combination of settings) that cannot work; the message is one line.
    ``setting`` names the one setting at fault when a single value is wrong (None when the
    fault is a combination of settings)."""

    def __init__(self, message: str, setting: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting
