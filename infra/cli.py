"""`herald`: one command line for the whole platform.

herald up [--detach]      start the embedded stack (Ctrl-C stops all of it)
herald status [--json]    is every component healthy? (exit 0 only if so)
herald down               stop a stack started with --detach (or in another terminal)
herald migrate            apply ClickHouse migrations
herald topics             list the topic catalog; `herald topics --create` creates them
herald schemas            check every Avro schema against its published history
herald logs NAME          print the end of a component's log
herald pause|resume|cancel NID, herald progress NID [--watch]   campaign control (cli_campaigns)
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from herald.config import ClickHouseSettings, HeraldSettings, RunSettings
from herald.errors import HeraldError
from herald.topics import DEAD_LETTERS
from infra.cli_campaigns import register as register_campaigns
from infra.cli_segments import app as segments_app

app = typer.Typer(
    help=(
        "Herald: a notification platform built from Bytewax dataflows over Kafka.\n\n"
        "Start everything on embedded defaults with `herald up`, check it with "
        "`herald status`, stop it with Ctrl-C (or `herald down` after `up --detach`)."
    ),
    no_args_is_help=True,
    add_completion=False,
)
console = Console()
err = Console(stderr=True)

RunDir = Annotated[
    Path | None,
    typer.Option("--run-dir", help="Run directory for data, logs and state (env HERALD_RUN_DIR)."),
]


def _run_dir(option: Path | None) -> Path:
    return (option or RunSettings().run_dir).resolve()


def _setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    # health checks poll over HTTP; one line per poll is noise
    logging.getLogger("httpx").setLevel(logging.WARNING)


@app.command()
def up(
    detach: Annotated[
        bool, typer.Option("--detach", "-d", help="Start in the background and return.")
    ] = False,
    run_dir: RunDir = None,
    processes: Annotated[
        int | None,
        typer.Option(
            "--processes",
            "-p",
            min=1,
            max=16,
            help="Bytewax processes per job, joined as a cluster with -i/-a on loopback "
            "(default 1, or HERALD_RUN_PROCESSES).",
        ),
    ] = None,
) -> None:
    """Start Kafka (Tansu), Redis, ClickHouse (chDB) and every Herald job on free local ports."""
    from herald.config import RunSettings
    from infra.stack import Stack, is_locked, read_state

    path = _run_dir(run_dir)
    count = processes if processes is not None else RunSettings().processes
    if is_locked(path):
        state = read_state(path) or {}
        err.print(
            f"[yellow]A Herald stack is already running in {path} "
            f"(supervisor pid {state.get('supervisor_pid', '?')}).[/] "
            "Use `herald status` to see it or `herald down` to stop it."
        )
        raise typer.Exit(1)
    if detach:
        _up_detached(path, count)
        return
    _setup_logging()
    started = time.monotonic()
    stack = Stack(path, on_event=lambda msg: console.print(f"[dim]·[/] {msg}"), processes=count)
    stack.install_signal_handlers()
    try:
        stack.start()
    except HeraldError as exc:
        err.print(f"[red]herald up failed:[/] {exc}")
        raise typer.Exit(1) from exc
    console.print(
        f"[green]Herald is up[/] in {time.monotonic() - started:.1f}s — run directory {path}\n"
        "`herald status` in another terminal shows the addresses; Ctrl-C stops everything."
    )
    try:
        stack.supervise()
    finally:
        console.print("stopping…")
        stack.stop()
        console.print("[green]stopped[/]: no process left behind")


def _up_detached(path: Path, processes: int = 1) -> None:
    from infra.stack import read_state

    path.mkdir(parents=True, exist_ok=True)
    log_path = path / "logs" / "supervisor.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as logfile:
        proc = subprocess.Popen(
            [sys.executable, "-m", "infra.cli", "up", "--run-dir", str(path)]
            + ["--processes", str(processes)],
            stdin=subprocess.DEVNULL,
            stdout=logfile,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 180 * processes  # every job's processes start
    with console.status("starting the embedded stack…"):
        while time.monotonic() < deadline:
            state = read_state(path)
            if state and state.get("ready") and state.get("supervisor_pid") == proc.pid:
                console.print(f"[green]Herald is up[/] (supervisor pid {proc.pid}); log {log_path}")
                return
            if proc.poll() is not None:
                err.print(f"[red]herald up failed[/] (exit {proc.returncode}); see {log_path}")
                raise typer.Exit(1)
            time.sleep(0.2)
    err.print(f"[red]the stack did not become ready in time[/]; see {log_path}")
    raise typer.Exit(1)


@app.command()
def status(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    run_dir: RunDir = None,
) -> None:
    """Show every component with its address; exit 0 only when all are healthy."""
    from infra.stack import stack_status

    path = _run_dir(run_dir)
    state, components = stack_status(path)
    healthy = state is not None and bool(state.get("ready")) and all(c.healthy for c in components)
    if as_json:
        doc = {
            "running": state is not None,
            "healthy": healthy,
            "run_dir": str(path),
            "services": {
                c.name: {
                    "kind": c.kind,
                    "pid": c.pid,
                    "address": c.address,
                    "healthy": c.healthy,
                    "detail": c.detail,
                }
                for c in components
            },
            "api_url": (state or {}).get("urls", {}).get("api"),
            "dashboard_url": (state or {}).get("urls", {}).get("dashboard"),
            "registry_url": (state or {}).get("urls", {}).get("registry"),
            "env": (state or {}).get("env", {}),
        }
        print(json.dumps(doc, indent=2))
    elif state is None:
        console.print(f"no Herald stack is running in {path} (start one with `herald up`)")
    else:
        table = Table(title=f"Herald stack in {path}")
        for col in ("component", "kind", "pid", "address", "status"):
            table.add_column(col)
        for c in components:
            mark = "[green]healthy[/]" if c.healthy else f"[red]{c.detail}[/]"
            table.add_row(c.name, c.kind, str(c.pid), c.address, mark)
        console.print(table)
        if not state.get("ready"):
            console.print("[yellow]still starting…[/]")
    raise typer.Exit(0 if healthy else 1)


@app.command()
def down(run_dir: RunDir = None) -> None:
    """Stop the stack running in the run directory; no process is left behind."""
    from infra.stack import stop_stack

    path = _run_dir(run_dir)
    with console.status("stopping…"):
        stopped = stop_stack(path)
    console.print("[green]stopped[/]" if stopped else f"nothing was running in {path}")


@app.command()
def migrate(
    dsn: Annotated[
        str | None, typer.Option(help="ClickHouse HTTP DSN (env HERALD_CLICKHOUSE_DSN).")
    ] = None,
    run_dir: RunDir = None,
) -> None:
    """Apply the numbered ClickHouse migrations in infra/migrations (idempotent)."""
    from herald.clickhouse import herald_client
    from infra.migrate import apply_migrations

    settings = ClickHouseSettings(dsn=dsn) if dsn else _stack_settings(run_dir).clickhouse
    client = herald_client(settings)
    try:
        applied = apply_migrations(client, settings.database)
    except HeraldError as exc:
        err.print(f"[red]migration failed:[/] {exc}")
        raise typer.Exit(1) from exc
    finally:
        client.close()
    console.print(f"applied {len(applied)} migration(s): {', '.join(applied) or 'none pending'}")


@app.command()
def topics(
    create: Annotated[bool, typer.Option("--create", help="Create missing topics.")] = False,
    run_dir: RunDir = None,
) -> None:
    """List the topic catalog (herald/topics.toml); with --create, create missing topics."""
    from herald.topics import load_topics
    from infra.topics import create_topics

    catalog = load_topics()
    if create:
        kafka = _stack_settings(run_dir).kafka
        created = create_topics(kafka, catalog)
        console.print(f"created {len(created)} topic(s) on {kafka.bootstrap_servers}")
        return
    table = Table(title="Kafka topics (herald/topics.toml)")
    for col in ("topic", "partitions", "key", "schema", "policy"):
        table.add_column(col)
    for spec in catalog.values():
        table.add_row(spec.name, str(spec.partitions), spec.key, spec.schema, spec.cleanup_policy)
    console.print(table)


@app.command()
def schemas(
    publish: Annotated[
        list[str] | None,
        typer.Option("--publish", help="Record the current version of this schema in history."),
    ] = None,
) -> None:
    """Check every Avro schema in schemas/ against its published versions (backward compatible)."""
    from schemas import compat

    if publish:
        for name in publish:
            try:
                changed = compat.publish(name)
            except HeraldError as exc:
                err.print(f"[red]{name}: not published:[/] {exc}")
                raise typer.Exit(1) from exc
            console.print(f"{name}: {'published a new version' if changed else 'unchanged'}")
        return
    problems = compat.check_all()
    failing = {name: p for name, p in problems.items() if p}
    for name, found in sorted(problems.items()):
        console.print(f"{'[red]✗[/]' if found else '[green]✓[/]'} {name}")
        for problem in found:
            console.print(f"    {problem}")
    raise typer.Exit(1 if failing else 0)


@app.command()
def replay(
    topic: Annotated[
        str, typer.Option("--topic", help="Logical topic, e.g. herald.delivery-events")
    ],
    from_: Annotated[str, typer.Option("--from", help="Start: ISO 8601, `now` or relative `-2h`.")],
    to: Annotated[str, typer.Option("--to", help="End (exclusive), same forms.")] = "now",
    into: Annotated[
        str | None, typer.Option("--into", help="Copy the range into this topic instead.")
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Re-drive dead letters already replayed once.")
    ] = False,
    run_dir: RunDir = None,
) -> None:
    """Re-drive a time range of a topic, idempotently, with a progress bar.

    herald.delivery-events → rebuilds ClickHouse; herald.dead-letters → each letter back into
    its source topic (delivery_id and expire_at kept, expired ones dropped); any other topic →
    copied into --into (or itself).
    """
    from infra.replay import parse_time, replay_cli

    settings = _stack_settings(run_dir)
    exclude: set[str] = set()
    if topic == DEAD_LETTERS and into is None:
        # dispatch's letters are replayed by infra.dlq: same delivery_id and expire_at, a
        # fresh retry budget, expiry and opt-out re-checked; the rest by infra.replay
        from infra.dlq import replay_dead_letters

        try:
            since = parse_time(from_)
        except ValueError as exc:
            err.print(f"[red]bad time:[/] {exc}")
            raise typer.Exit(2) from exc
        with console.status("replaying dispatch dead letters…"):
            result = replay_dead_letters(settings, since=since, force=force)
        skipped = ", ".join(f"{k} {v}" for k, v in sorted(result.skipped.items())) or "none"
        console.print(
            f"dispatch dead letters: {result.replayed} replayed of {result.scanned} read, "
            f"skipped: {skipped}"
        )
        exclude.add("dispatch")
    code = replay_cli(settings, topic, from_, to, into, force=force, exclude_jobs=exclude)
    raise typer.Exit(code)


@app.command()
def logs(
    name: Annotated[str, typer.Argument(help="Component name, e.g. kafka, redis, accepted.")],
    lines: Annotated[int, typer.Option("-n", help="Number of lines.")] = 40,
    run_dir: RunDir = None,
) -> None:
    """Print the end of a component's log file."""
    path = _run_dir(run_dir) / "logs" / f"{name}.log"
    if not path.exists():
        err.print(f"no log for {name!r} at {path}")
        raise typer.Exit(1)
    print("\n".join(path.read_text(errors="replace").splitlines()[-lines:]))


@app.command()
def demo(
    run_dir: RunDir = None,
    campaign_size: Annotated[
        int,
        typer.Option(
            "--campaign-size",
            min=10,
            help="Recipients of the demo campaign (1M takes a 2-core machine several minutes "
            "to load and drain; the default drains in well under a minute).",
        ),
    ] = 50_000,
    campaign_channel: Annotated[
        str,
        typer.Option(
            "--campaign-channel",
            help="push (APNs) or email (shaped to the email provider's 800/s bulk budget).",
        ),
    ] = "push",
    likes: Annotated[int, typer.Option("--likes", min=4, help="Likes in the like storm.")] = 1200,
    keep: Annotated[
        bool, typer.Option("--keep", help="Leave a stack the demo started running.")
    ] = False,
) -> None:
    """A guided tour on the embedded stack: seven scenes and a summary (exit 0 if all passed).

    Uses the stack running in the run directory (`make run`), or starts one and stops it after.
    """
    from infra.demo import run_demo

    if campaign_channel not in ("push", "email"):
        err.print("--campaign-channel is push or email")
        raise typer.Exit(2)
    try:
        results = run_demo(
            _run_dir(run_dir),
            campaign_size=campaign_size,
            likes=likes,
            keep=keep,
            campaign_channel=campaign_channel,
        )
    except HeraldError as exc:
        err.print(f"[red]herald demo: {exc}[/]")
        raise typer.Exit(2) from exc
    raise typer.Exit(0 if all(r.passed for r in results) else 1)


def _stack_settings(run_dir: Path | None) -> HeraldSettings:
    """Settings of the running embedded stack when there is one, else from the environment."""
    import os

    from infra.stack import read_state

    state = read_state(_run_dir(run_dir))
    if state:
        # the stack's addresses win over the environment: this process talks to that stack
        os.environ.update(state["env"])
    return HeraldSettings()


register_campaigns(app)
app.add_typer(segments_app, name="segments")  # herald segments upload|query|list|show|delete


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
