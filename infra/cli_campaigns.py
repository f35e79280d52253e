"""`herald cancel | pause | resume | progress NOTIFICATION_ID`: campaign control from the
command line, through the running stack's API (api/controls.py) as a user's service would.

    herald pause  <nid>              hold it: planning stops, what reaches dispatch is parked
    herald resume <nid>              go on; parked deliveries are sent
    herald cancel <nid>              final: nothing not yet sent is sent
    herald progress <nid> [--watch]  users planned, deliveries sent / not sent / remaining

The key is the embedded stack's development key unless `--api-key` (or HERALD_API_KEY) names
another.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from infra.cli_api import ApiKey, RunDir, calling

__all__ = ["register"]

console = Console(soft_wrap=True)  # one line per answer, also when piped

NotificationId = Annotated[str, typer.Argument(help="The notification_id the API answered.")]


def _control(nid: str, action: str, run_dir: Path | None, api_key: str | None) -> None:
    with calling(action, run_dir, api_key) as client:
        answer = client.control(nid, action)
    note = "" if answer["settled"] else " (a dispatch worker was still sending when answered)"
    released = f", {answer['released']:,} parked deliveries released" if answer["released"] else ""
    console.print(f"{nid}: {answer['previous']} -> {answer['control']}{released}{note}")


def cancel(nid: NotificationId, run_dir: RunDir = None, api_key: ApiKey = None) -> None:
    """Cancel a notification: what is not sent yet ends SUPPRESSED `cancelled` (final)."""
    _control(nid, "cancel", run_dir, api_key)


def pause(nid: NotificationId, run_dir: RunDir = None, api_key: ApiKey = None) -> None:
    """Pause a notification: planning stops and deliveries reaching dispatch are parked."""
    _control(nid, "pause", run_dir, api_key)


def resume(nid: NotificationId, run_dir: RunDir = None, api_key: ApiKey = None) -> None:
    """Resume a paused notification: planning goes on, parked deliveries are sent."""
    _control(nid, "resume", run_dir, api_key)


def progress(
    nid: NotificationId,
    run_dir: RunDir = None,
    api_key: ApiKey = None,
    watch: Annotated[
        bool, typer.Option("--watch", help="Follow it with progress bars until nothing remains.")
    ] = False,
) -> None:
    """How far a notification got: users planned, deliveries sent, not sent and remaining."""
    with calling("progress", run_dir, api_key) as client:
        if watch:
            _watch(client, nid)
        else:
            console.print(_line(nid, client.status(nid, limit=1)["progress"]), markup=False)


def _line(nid: str, p: dict[str, Any]) -> str:
    total = p["users_total"] if p["users_total"] is not None else "?"
    planned = f"users planned {p['users_planned']:,}/{total}, " if p["users_planned"] else ""
    return (
        f"{nid} [{p['control']}]: {planned}deliveries {p['deliveries']:,}: sent {p['sent']:,}, "
        f"not sent {p['not_sent']:,}, remaining {p['remaining']:,}"
    )


def _watch(client: Any, nid: str) -> None:
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())  # fmt: skip
    with Progress(*columns, console=console) as bars:
        users = bars.add_task("users planned", total=None)
        done = bars.add_task("deliveries done", total=None)
        while True:
            p = client.status(nid, limit=1)["progress"]
            bars.update(users, completed=p["users_planned"] or 0, total=p["users_total"])
            finished = p["sent"] + p["not_sent"]
            bars.update(done, completed=finished, total=p["deliveries"] or None,
                        description=f"deliveries done ({p['control']})")  # fmt: skip
            planned_all = p["users_total"] is None or (p["users_planned"] or 0) >= p["users_total"]
            if p["deliveries"] and not p["remaining"] and planned_all:
                break
            if p["control"] == "paused":
                bars.update(done, description="deliveries done (paused: `herald resume`)")
            time.sleep(1)
    console.print(_line(nid, p), markup=False)


def register(app: typer.Typer) -> None:
    """Add the commands to the `herald` app."""
    for command in (cancel, pause, resume, progress):
        app.command()(command)
