"""The one error type of the configuration."""

from __future__ import annotations

from typing import Protocol


class ConfigError(ValueError):
    """A setting (or a combination of settings) that cannot work; the message is one line.
    ``setting`` names the one setting at fault when a single value is wrong (None when the
    fault is a combination of settings)."""

    def __init__(self, message: str, setting: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting


class ConstructError(ConfigError):
    """A construct's props that cannot work, found while the construct is built (as aws-eks-v2's
    ``ValidationError(code, message, this)``): the message starts with the construct's path, then
    the value and the fix, and ends with a stable ``code`` a caller can match."""

    def __init__(self, scope: _HasNode, code: str, message: str, setting: str | None = None) -> None:
        super().__init__(f"{scope.node.path}: {message} [{code}]", setting)
        self.code = code


class _Node(Protocol):
    @property
    def path(self) -> str: ...


class _HasNode(Protocol):
    """Any construct (the configuration imports no CDK library)."""

    @property
    def node(self) -> _Node: ...
