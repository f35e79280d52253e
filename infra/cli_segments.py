"""`herald segments ...`: audiences of the running stack, through its API (api/routes/segments.py)
as a tenant's service would.

    herald segments upload ID FILE [--csv]   stream FILE (NDJSON, or CSV with a user_id column;
                                             `-` reads stdin) with a progress bar
    herald segments query ID SQL             members from a read-only ClickHouse query
    herald segments list                     the tenant's segments
    herald segments show ID                  size, source, created_at
    herald segments delete ID [--yes]        unregister it and delete its members

The key is the embedded stack's development key unless `--api-key` (or HERALD_API_KEY) names
another.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from infra.cli_api import ApiKey, RunDir, calling

__all__ = ["app"]

app = typer.Typer(
    help="Segments (audiences): upload, query, list, show and delete them through the API.",
    no_args_is_help=True,
)
console = Console(soft_wrap=True)
err = Console(stderr=True)

CHUNK = 1 << 20  # bytes read and sent at a time
SegmentId = Annotated[str, typer.Argument(help="The segment_id (printable ASCII, no / or {}).")]


def _answer(resp: httpx.Response, status: int, what: str) -> dict[str, Any]:
    """The JSON body of an expected answer; otherwise the problem's code and detail, exit 1."""
    if resp.status_code == status:
        return dict(resp.json()) if resp.content else {}
    try:
        problem = resp.json()
        where = f" (line {problem['line']})" if "line" in problem else ""
        where += f" (row {problem['row']})" if "row" in problem else ""
        text = f"{problem.get('code')}{where}: {problem.get('detail') or problem.get('title')}"
    except (ValueError, AttributeError):
        text = resp.text[:500]
    err.print(f"[red]{what}: HTTP {resp.status_code} {text}[/]")
    raise typer.Exit(1)


def _summary(segment: dict[str, Any]) -> str:
    return (
        f"{segment['segment_id']}: {segment['size']:,} users "
        f"({segment['source']}, created {segment['created_at']})"
    )


@app.command()
def upload(
    segment_id: SegmentId,
    file: Annotated[Path, typer.Argument(help="NDJSON or CSV file; - for stdin.")],
    csv: Annotated[
        bool, typer.Option("--csv", help="The file is CSV (default: by its .csv suffix).")
    ] = False,
    run_dir: RunDir = None,
    api_key: ApiKey = None,
) -> None:
    """Create a segment from a file, streamed (millions of lines are fine)."""
    is_csv = csv or file.suffix.lower() == ".csv"
    headers = {"Content-Type": "text/csv" if is_csv else "application/x-ndjson"}
    stdin = str(file) == "-"
    try:
        source: IO[bytes] = sys.stdin.buffer if stdin else file.open("rb")
    except OSError as exc:
        err.print(f"[red]cannot read {file}: {exc.strerror}[/]")
        raise typer.Exit(2) from exc
    total = None if stdin else file.stat().st_size
    columns = (TextColumn("uploading {task.description}"), BarColumn(), DownloadColumn(),
               TransferSpeedColumn(), TimeElapsedColumn())  # fmt: skip
    with (
        calling("segments upload", run_dir, api_key) as client,
        source,
        Progress(*columns, console=err) as bars,
    ):
        task = bars.add_task(segment_id, total=total)

        def chunks() -> Iterator[bytes]:
            while chunk := source.read(CHUNK):
                bars.advance(task, len(chunk))
                yield chunk
            bars.update(task, description=f"{segment_id} (counting members)")

        resp = client.api.put(
            f"/v1/segments/{segment_id}", content=chunks(), headers=headers,
            timeout=httpx.Timeout(30.0, read=None),
        )  # fmt: skip
    console.print(_summary(_answer(resp, 201, f"upload {segment_id}")))


@app.command()
def query(
    segment_id: SegmentId,
    sql: Annotated[
        str, typer.Argument(help="SELECT user_id[, params Map(String, String)] FROM ...")
    ],
    run_dir: RunDir = None,
    api_key: ApiKey = None,
) -> None:
    """Create a segment from a read-only ClickHouse query (the key needs segments:query)."""
    body = {"segment_id": segment_id, "query": sql}
    running = console.status(f"running the query into {segment_id}…")
    with calling("segments query", run_dir, api_key) as client, running:
        resp = client.api.post("/v1/segments", json=body, timeout=httpx.Timeout(30, read=None))
    console.print(_summary(_answer(resp, 201, f"query {segment_id}")))


@app.command("list")
def list_(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object a line.")] = False,
    run_dir: RunDir = None,
    api_key: ApiKey = None,
) -> None:
    """Every segment of the tenant, in segment_id order."""
    found: list[dict[str, Any]] = []
    with calling("segments list", run_dir, api_key) as client:
        params: dict[str, Any] = {"limit": 1000}
        while True:
            page = _answer(client.api.get("/v1/segments", params=params), 200, "list")
            found += page["segments"]
            if page["next_cursor"] is None:
                break
            params["cursor"] = page["next_cursor"]
    if as_json:
        for segment in found:
            print(json.dumps(segment))
        return
    table = Table(title=f"{len(found)} segment(s)")
    for column in ("segment_id", "users", "source", "created_at"):
        table.add_column(column, justify="right" if column == "users" else "left")
    for s in found:
        table.add_row(s["segment_id"], f"{s['size']:,}", s["source"], s["created_at"])
    console.print(table)


@app.command()
def show(segment_id: SegmentId, run_dir: RunDir = None, api_key: ApiKey = None) -> None:
    """A segment's size (distinct users), source and creation time."""
    with calling("segments show", run_dir, api_key) as client:
        resp = client.api.get(f"/v1/segments/{segment_id}")
    console.print(_summary(_answer(resp, 200, f"show {segment_id}")))


@app.command()
def delete(
    segment_id: SegmentId,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
    run_dir: RunDir = None,
    api_key: ApiKey = None,
) -> None:
    """Delete a segment: campaigns to it are refused and its members are deleted."""
    if not yes:
        typer.confirm(f"delete segment {segment_id} and its members?", abort=True)
    with calling("segments delete", run_dir, api_key) as client:
        resp = client.api.delete(f"/v1/segments/{segment_id}")
    _answer(resp, 204, f"delete {segment_id}")
    console.print(f"{segment_id}: deleted")
