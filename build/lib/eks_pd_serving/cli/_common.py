"""What the subcommands share: the project's configuration and rich output."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ..config import ConfigError, DeploymentConfig

console = Console(highlight=False, soft_wrap=True)


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--project", type=Path, default=Path("."), help="folder with cdk.json (default: .)")
    parser.add_argument(
        "-c",
        "--context",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a setting, as with cdk -c",
    )


def context_of(project: Path, overrides: list[str]) -> dict[str, Any]:
    """cdk.json context, then cdk.context.json, then -c overrides: the order the CDK CLI uses."""
    context: dict[str, Any] = {}
    cdk_json = project / "cdk.json"
    if cdk_json.exists():
        context.update(json.loads(cdk_json.read_text()).get("context", {}))
    saved = project / "cdk.context.json"
    if saved.exists():
        context.update(json.loads(saved.read_text()))
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"-c {item!r}: not KEY=VALUE. Fix: write -c {item}=<value>")
        context[key] = value
    return context


def load_config(args: argparse.Namespace) -> DeploymentConfig:
    return DeploymentConfig.from_context(context_of(args.project, args.context))


def table(title: str, columns: list[str], rows: list[list[str]]) -> Table:
    result = Table(title=title, title_justify="left")
    for column in columns:
        result.add_column(column)
    for row in rows:
        result.add_row(*row)
    return result
