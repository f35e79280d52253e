"""What the `herald` commands that talk to a running stack's API share: the `--run-dir` and
`--api-key` options and the client (infra/stackclient.py), whose failures end the command
with their message (exit 1), never a traceback."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console

from herald.errors import HeraldError

__all__ = ["ApiKey", "RunDir", "calling", "stack_client"]

RunDir = Annotated[
    Path | None,
    typer.Option("--run-dir", help="Run directory of the stack (env HERALD_RUN_DIR)."),
]
ApiKey = Annotated[
    str | None,
    typer.Option("--api-key", envvar="HERALD_API_KEY", help="API key (default: the dev key)."),
]
err = Console(stderr=True)


def stack_client(run_dir: Path | None, api_key: str | None) -> Any:
    """The client of the stack running in `run_dir` (the dev key unless `api_key`)."""
    from herald.config import RunSettings
    from infra.stackclient import StackClient

    path = (run_dir or RunSettings().run_dir).resolve()
    extra = {"api_key": api_key} if api_key else {}
    return StackClient.from_run_dir(path, **extra)


@contextlib.contextmanager
def calling(command: str, run_dir: Path | None, api_key: str | None) -> Iterator[Any]:
    """`stack_client` for `herald COMMAND`; a stack that is not running, an unreachable API or
    an error answer ends the command (exit 1)."""
    try:
        with stack_client(run_dir, api_key) as client:
            yield client
    except (HeraldError, httpx.HTTPError) as exc:
        err.print(f"[red]herald {command}: {exc}[/]")
        raise typer.Exit(1) from exc
