"""How `herald demo` talks to the newcomer: scene headers, steps, spinners, the summary table."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from infra.demo.logic import SceneResult

__all__ = ["Ui"]

T = TypeVar("T")


class Ui:
    """Rich output on one console; plain text when the console is not a terminal."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console()

    def scene(self, number: int, title: str, what: str) -> None:
        """Open a scene: its number, title and what it is about to show."""
        self.console.print()
        self.console.print(Panel(what, title=f"[bold]Scene {number}: {title}[/]", expand=False))

    def step(self, text: str) -> None:
        """Something the demo does."""
        self.console.print(f"  [cyan]→[/] {text}")

    def saw(self, text: str) -> None:
        """Something the demo observed."""
        self.console.print(f"  [green]✓[/] {text}")

    def warn(self, text: str) -> None:
        self.console.print(f"  [yellow]![/] {text}")

    def verdict(self, result: SceneResult) -> None:
        mark = "[bold green]PASSED[/]" if result.passed else "[bold red]FAILED[/]"
        self.console.print(f"  {mark} {result.observed}")

    def wait(
        self,
        what: str,
        probe: Callable[[], T | None],
        timeout: float,
        interval: float = 0.25,
    ) -> T:
        """Poll `probe` under a spinner until it returns something other than None.

        Raises TimeoutError naming `what` when `timeout` seconds pass first.
        """
        started = time.monotonic()
        with self.console.status(f"[cyan]{what}[/]") as status:
            while True:
                value = probe()
                if value is not None:
                    return value
                elapsed = time.monotonic() - started
                if elapsed >= timeout:
                    raise TimeoutError(f"{what}: nothing after {timeout:.0f}s")
                status.update(f"[cyan]{what}[/] ({elapsed:.0f}s)")
                time.sleep(interval)

    def summary(self, results: list[SceneResult]) -> None:
        """The table a newcomer reads at the end: one row per scene."""
        table = Table(title="herald demo: summary", show_lines=True)
        table.add_column("#", justify="right")
        table.add_column("scene")
        table.add_column("result")
        table.add_column("observed")
        for r in results:
            mark = "[green]passed[/]" if r.passed else "[red]FAILED[/]"
            table.add_row(str(r.number), r.title, mark, r.observed)
        self.console.print()
        self.console.print(table)
        passed = sum(r.passed for r in results)
        colour = "green" if passed == len(results) else "red"
        self.console.print(f"[bold {colour}]{passed} of {len(results)} scenes passed[/]")
