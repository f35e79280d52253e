"""`python -m bench [SCENARIO ...]` (`make bench`): run benchmark scenarios, write a report.

Each scenario is a module of this package runnable on its own (`python -m bench.plan`); it
starts its own embedded stack, measures Herald beside a raw baseline of the same records in
the same run, and prints its figures. This runner runs them one after another (never in
parallel: they would measure each other), keeps each one's output in
bench/results/<scenario>.txt and collects them in bench/results/REPORT.md.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

SCENARIOS = ("api_accept", "plan", "digest", "dispatch")
RESULTS = Path(__file__).with_name("results")


def run_scenario(name: str, timeout: float) -> tuple[int, str, float]:
    """Run one scenario in its own process; returns (exit code, output, seconds)."""
    started = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", f"bench.{name}"],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        code, output = proc.returncode, proc.stdout + proc.stderr[-4000:]
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        code, output = 124, out + f"\n(timed out after {timeout:.0f}s)"
    return code, output, time.monotonic() - started


def write_report(results: dict[str, tuple[int, str, float]]) -> Path:
    lines = [
        "# Herald benchmark report",
        "",
        f"Run {datetime.now(UTC):%Y-%m-%d %H:%M UTC} on this machine "
        "(2 cores; shared and noisy: compare ratios to the baselines, not absolute times).",
        "Reproduce with `make bench` (or `python -m bench SCENARIO`).",
        "",
    ]
    for name, (code, output, seconds) in results.items():
        status = "ok" if code == 0 else f"failed (exit {code})"
        lines += [f"## {name} — {status}, {seconds:.0f}s", "", "```", output.strip(), "```", ""]
    report = RESULTS / "REPORT.md"
    report.write_text("\n".join(lines))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("scenarios", nargs="*", help=f"any of {', '.join(SCENARIOS)} (default all)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per scenario")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.scenarios) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(unknown)}")
    RESULTS.mkdir(exist_ok=True)
    results: dict[str, tuple[int, str, float]] = {}
    for name in args.scenarios or SCENARIOS:
        print(f"== {name} …", flush=True)
        code, output, seconds = run_scenario(name, args.timeout)
        (RESULTS / f"{name}.txt").write_text(output)
        print(output.strip(), flush=True)
        results[name] = (code, output, seconds)
    report = write_report(results)
    print(f"report: {report}")
    return 0 if all(code == 0 for code, _, _ in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
