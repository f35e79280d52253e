"""`python -m bench [SCENARIO ...] [--quick]` (`make bench`): every SPEC §6 benchmark, one report.

Each scenario is a module of this package runnable on its own (`python -m bench.plan`) that
starts its own embedded stack and measures Herald beside a raw baseline of the same work in the
same run. This runner runs them one after another, each in its own child process (never in
parallel: they would measure each other; a crash or leak stays in the child), takes each one's
structured result (bench/_report.py), draws its plots (bench/_plots.py) and writes
bench/results/REPORT.md with the PNGs beside it. Each child's output is kept in
bench/results/<scenario>.txt.

Running some scenarios (`python -m bench fullstack transports`) updates their sections and
keeps every other scenario's earlier figures in the report, each dated by its own run: a run
leaves its record beside the report (`.NAME.json`, the result; `.NAME.run.json`, status, seconds
and date) and the plots of the scenarios kept are drawn again from their results.

`--quick` runs small volumes (a smoke run for tests, seconds per scenario, figures not
meaningful, nothing earlier kept); `--out DIR` writes elsewhere than bench/results.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench._report import render

# name -> (callable "module:function" returning a Result dict given quick=..., timeout s).
# Timeouts are a safety net for a wedged scenario, generous for a loaded machine.
SCENARIOS: dict[str, tuple[str, float]] = {
    # the whole stack first (SPEC §6: these are the figures that count); components follow
    "fullstack": ("bench.fullstack:result", 1200),
    # a plan job killed under OTP traffic at 100k and 1M users; dispatch killed twice
    "restart": ("bench.restart:result", 1800),
    "api_accept": ("bench._adapters:api_accept", 300),
    "plan": ("bench._adapters:plan", 600),
    "digest": ("bench._adapters:digest", 420),
    "dispatch": ("bench._adapters:dispatch", 600),
    "otp_latency": ("bench.otp_latency:result", 480),
    "smoothing": ("bench.smoothing:result", 420),
    # inbox WebSockets on one API process beside the accept latency
    "inbox_sockets": ("bench.inbox_sockets:result", 600),
    # bad inputs of every kind against the API, the callbacks and the topics of a whole stack
    "hostile": ("bench.hostile:result", 1200),
    "recovery": ("bench._adapters:recovery", 900),
    # Herald's own Avro code beside confluent-kafka's serializers (why it is kept)
    "serde": ("bench.serde:result", 300),
    # Herald's own HTTP transports beside maintained clients (pyreqwest, aiohttp)
    "transports": ("bench.transports:result", 600),
}
# Scenarios whose module another piece of work adds; absent → "not run", never a failure.
OPTIONAL = {"recovery": "bench.recovery"}
RESULTS = Path(__file__).with_name("results")
REPO = Path(__file__).resolve().parents[1]


def call(target: str, quick: bool) -> dict[str, Any]:
    """Import `module:function` and call it (in this process)."""
    module, func = target.split(":")
    result: dict[str, Any] = getattr(importlib.import_module(module), func)(quick=quick)
    return result


def run_child(name: str, quick: bool, out: Path, timeout: float) -> dict[str, Any]:
    """Run one scenario in a child process; returns its run record for the report."""
    result_path = out / f".{name}.json"
    result_path.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "bench", "--one", name, "--result", str(result_path)]
    run_at = datetime.now(UTC)
    started = time.monotonic()
    proc = subprocess.Popen(
        [*argv, *(["--quick"] if quick else [])],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
        start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = proc.communicate(timeout=timeout)
        code = proc.returncode
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGTERM)  # the child's `finally` stops its stacks
        proc.communicate(timeout=150)
        raise
    except subprocess.TimeoutExpired:
        # SIGTERM first: the child turns it into SystemExit, so its `finally` blocks stop the
        # stacks it started (`herald down`); only then the whole process group goes.
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            output, _ = proc.communicate(timeout=150)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
        code, output = 124, (output or "") + f"\n(timed out after {timeout:.0f}s)"
    seconds = time.monotonic() - started
    (out / f"{name}.txt").write_text(output)
    run: dict[str, Any] = {"seconds": seconds, "result": None, "error": "", "pngs": [],
                           "run_at": f"{run_at:%Y-%m-%d %H:%M}"}  # fmt: skip
    if code == 0 and result_path.exists():
        run["result"] = json.loads(result_path.read_text())
        run["status"] = "ok"  # the raw result stays beside the report (.NAME.json)
    else:
        result_path.unlink(missing_ok=True)  # a failed run keeps no result of an earlier one
        run["status"] = f"failed (exit {code})"
        run["error"] = output[-3000:]
    record = {k: run[k] for k in ("status", "seconds", "run_at", "error")}
    (out / f".{name}.run.json").write_text(json.dumps(record))
    return run


def earlier_runs(out: Path, skip: list[str]) -> dict[str, dict[str, Any]]:
    """The run records left in `out` by earlier runs of the scenarios not in `skip`, with their
    results and their plots drawn again (a record without its result keeps its status)."""
    kept: dict[str, dict[str, Any]] = {}
    for name in SCENARIOS:
        record_path = out / f".{name}.run.json"
        if name in skip or not record_path.exists():
            continue
        try:
            run = {**json.loads(record_path.read_text()), "result": None, "pngs": []}
            result_path = out / f".{name}.json"
            if run["status"] == "ok" and result_path.exists():
                run["result"] = json.loads(result_path.read_text())
        except (OSError, ValueError, KeyError) as exc:
            print(f"   {name}: earlier record unreadable ({exc!r}); left out", flush=True)
            continue
        draw(name, run, out)
        kept[name] = run
    return kept


def draw(name: str, run: dict[str, Any], out: Path) -> None:
    """Render the result's plots next to the report (a plot that fails is noted, not fatal)."""
    from bench._plots import render_plot

    for plot in (run.get("result") or {}).get("plots", []):
        try:
            run["pngs"].append(render_plot(plot, out, name).name)
        except Exception as exc:  # noqa: BLE001 - a broken plot must not lose the report
            run["result"]["notes"].append(f"plot {plot.get('name')} failed: {exc!r}")


def _write(out: Path, runs: dict[str, dict[str, Any]], quick: bool, started: datetime) -> None:
    order = [*SCENARIOS, *(n for n in runs if n not in SCENARIOS)]
    runs = {name: runs[name] for name in order if name in runs}
    text = render(runs, quick=quick, started=started, cores=os.cpu_count())
    (out / "REPORT.md").write_text(text)


def main(argv: list[str] | None = None) -> int:
    """Run the scenarios and write the report; exit 1 if any scenario failed."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("scenarios", nargs="*", help=f"any of {', '.join(SCENARIOS)} (default all)")
    parser.add_argument("--quick", action="store_true", help="small volumes (smoke run)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="report directory")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # child mode: run one scenario
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run `finally` (stack stops)
        res = call(SCENARIOS[args.one][0], args.quick)
        args.result.write_text(json.dumps(res, default=str))
        return 0
    unknown = sorted(set(args.scenarios) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(unknown)}")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.png"):
        old.unlink()
    started = datetime.now(UTC)
    selected = args.scenarios or list(SCENARIOS)
    kept = {} if args.quick else earlier_runs(out, selected)
    runs: dict[str, dict[str, Any]] = dict(kept)
    # SIGTERM (e.g. `kill PID` of a run that must end): the running child is stopped by its own
    # SIGTERM handling (run_child), the rest is reported "not run"
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        _run_all(args, out, runs, started)
    except KeyboardInterrupt:
        for name in selected:
            runs.setdefault(name, {"status": "not run (the run was interrupted)", "seconds": 0,
                                   "result": None, "error": "", "pngs": []})  # fmt: skip
    _write(out, runs, args.quick, started)
    print(f"report: {out / 'REPORT.md'}")
    mine = [runs[name] for name in selected if name in runs]
    return 0 if all(r["status"] == "ok" or "not run" in r["status"] for r in mine) else 1


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def _run_all(
    args: argparse.Namespace, out: Path, runs: dict[str, dict[str, Any]], started: datetime
) -> None:
    """Each scenario in turn; the report is rewritten after each (a partial run reports)."""
    for name in args.scenarios or list(SCENARIOS):
        module = OPTIONAL.get(name)
        if module and importlib.util.find_spec(module) is None:
            runs[name] = {"status": f"not run ({module} is not present)", "seconds": 0,
                          "result": None, "error": "", "pngs": []}  # fmt: skip
            print(f"== {name}: not run ({module} is not present)", flush=True)
            continue
        print(f"== {name} …", flush=True)
        timeout = SCENARIOS[name][1]
        runs[name] = run = run_child(name, args.quick, out, timeout)
        draw(name, run, out)
        print(f"   {run['status']} in {run['seconds']:.0f}s", flush=True)
        _write(out, runs, args.quick, started)


if __name__ == "__main__":
    sys.exit(main())
