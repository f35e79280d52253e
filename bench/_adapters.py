"""Structured results (bench/_report.py) from the scenarios that print their own figures.

api_accept, plan, digest and dispatch are tuned by other work and keep their own output
(`python -m bench.plan` prints a figure table); these adapters call each scenario's entry
point (`run(...)` or `main([... "--json", PATH])`) and map its figures onto Figures beside
their baselines, so the runner renders every scenario the same way. An adapter reads figures
by name and tolerates missing ones (shown as "—") rather than failing the report.
"""

from __future__ import annotations

import importlib
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._report import figure, per_second, result

__all__ = ["api_accept", "digest", "dispatch", "plan", "recovery"]

KAFKA = "Kafka consume→produce of the same records"


def _fresh_stack(run: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    """Call `run(settings)` on a fresh embedded stack (Kafka, Redis, ClickHouse) in a temp dir."""
    from bench._harness import embedded_stack

    with tempfile.TemporaryDirectory(prefix="herald-bench-") as tmp, embedded_stack(Path(tmp)) as s:
        return run(s)


def _json_main(module: str, argv: list[str]) -> dict[str, Any]:
    """`module.main(argv + ["--json", PATH])`, then the JSON it wrote."""
    with tempfile.TemporaryDirectory(prefix="herald-bench-json-") as tmp:
        path = Path(tmp) / "out.json"
        importlib.import_module(module).main([*argv, "--json", str(path)])
        data: dict[str, Any] = json.loads(path.read_text())
        return data


def _get(data: dict[str, Any], *keys: str) -> float | None:
    """The first of `keys` present in `data` (a figures dict), as float."""
    for key in keys:
        if isinstance(data.get(key), int | float):
            return float(data[key])
    return None


def api_accept(quick: bool = False) -> dict[str, Any]:
    """POST /v1/notifications at a fixed offered load beside a plain acks=all produce."""
    rate, seconds = (300, 4) if quick else (2000, 10)
    argv = ["--rate", str(rate), "--duration", str(seconds), "--samples"]
    data = _json_main("bench.api_accept", [*argv, "--warmup", "1" if quick else "3"])
    api, raw = data["api"], data["raw_kafka"]
    base = "plain acks=all produce, same schedule"
    figs = [
        figure("accepted/s at the offered load", api["accepted_per_s"], "req/s",
               baseline=raw["accepted_per_s"], baseline_name=base),
        figure("error rate (non-202)", api["error_rate"], "", baseline=raw["error_rate"],
               baseline_name=base, better="lower", target="< 0.01 % (99.99 %)"),
    ]  # fmt: skip
    for p in ("p50", "p90", "p99", "max"):
        target = "< 20 ms (seed: < 200 ms)" if p == "p99" else ""
        figs.append(figure(f"latency {p}", api[f"{p}_ms"], "ms", baseline=raw[f"{p}_ms"],
                           baseline_name=base, better="lower", target=target))  # fmt: skip
    samples = data.get("samples", {})
    plots: list[dict[str, Any]] = []
    if samples:
        plots.append({
            "kind": "hist", "name": "latency", "xlabel": "ms (scheduled send → response)",
            "title": f"API accept latency at {rate:,} req/s offered (open loop)",
            "data": {"Herald API (202 after Kafka ack)": samples["api"]["latency_ms"],
                     "raw acks=all produce": samples["raw_kafka"]["latency_ms"]},
        })  # fmt: skip
        series = {
            label: per_second(samples[key]["done_s"], start=0.0)[:seconds]
            for key, label in (("api", "Herald API 202/s"), ("raw_kafka", "raw produce/s"))
        }
        plots.append({
            "kind": "lines", "name": "throughput", "xlabel": "s", "ylabel": "completions/s",
            "title": "API accept throughput over time",
            "data": {k: [list(range(len(v))), v] for k, v in series.items()},
            "hlines": {f"offered {rate:,}/s": rate},
        })  # fmt: skip
    data.pop("samples", None)
    notes = [f"Offered {rate:,} req/s for {seconds} s, open loop (latency from the scheduled "
             "instant, no coordinated omission), 1 API worker."]  # fmt: skip
    return result("API accept: POST /v1/notifications, 202 after Kafka ack", figs,
                  notes=notes, plots=plots, details=data)  # fmt: skip


def plan(quick: bool = False) -> dict[str, Any]:
    """Deliveries/s through dataflows.plan beside Kafka consume→produce of its output; then
    (not with `quick`) the job as 1 and as 2 `bytewax.run` processes."""
    from bench import plan as scenario

    users, spread = (5_000, 0) if quick else (60_000, 100_000)

    def both(stack: Any) -> dict[str, Any]:
        data = scenario.run(stack, users)
        if spread:
            data["diverse"] = scenario.run(stack, users, diverse=True)
            data["processes"] = scenario.run_processes(stack, spread, [1, 2])
        return data

    data = _fresh_stack(both)
    base = _get(data, "baseline consume->produce rec/s")
    figs = [
        figure("plan output records/s (deliveries + events)",
               _get(data, "plan output records/s"), "rec/s", baseline=base, baseline_name=KAFKA),
        figure("plan deliveries/s", _get(data, "plan deliveries/s"), "deliveries/s",
               target="≥ 50k/s per process"),
        figure("plan deliveries per CPU second", _get(data, "plan deliveries per CPU second"),
               "deliveries/CPU s"),
        figure("the same job with a no-op planner, deliveries/s",
               _get(data, "no-op planner deliveries/s"), "deliveries/s"),
    ]  # fmt: skip
    notes = [f"Bulk marketing campaign to {users:,} users (1,000 per request), one Bytewax "
             "worker in-process, recovery on; the users copied to Redis by the users job first, "
             "startup subtracted; every user's copies read and parsed (cold: the process has "
             "not seen them). The no-op planner reads the users' state and emits copies of real "
             "records per user without deciding anything: what the rest of the job allows, "
             "whatever planning costs."]  # fmt: skip
    if spread:
        diverse, procs = data["diverse"], data["processes"]
        figs += [
            figure("every user in a class of their own (planned in full), deliveries/s",
                   _get(diverse, "plan deliveries/s"), "deliveries/s"),
            figure("every user in a class of their own, deliveries per CPU second",
                   _get(diverse, "plan deliveries per CPU second"), "deliveries/CPU s"),
        ]  # fmt: skip
        notes.append(
            "Users of a class (same preferences and kinds of contact points, "
            "dataflows/plan/planned_alike.py) get their records from a template; the campaign's "
            "users fall into 32 classes. Run again with every user in a class of their own (a "
            "one-minute quiet-hours window each): every user planned in full."
        )
        figs += [
            figure("as 1 bytewax.run process, deliveries/s",
                   _get(procs, "run 1, 1 process: deliveries/s"), "deliveries/s"),
            figure("as 2 bytewax.run processes (-i/-a), deliveries/s",
                   _get(procs, "run 2, 2 processes: deliveries/s"), "deliveries/s"),
        ]  # fmt: skip
        notes.append(f"Then the job as `python -m bytewax.run` processes over a {spread:,}-user "
                     "campaign (no recovery): 1 process, then 2 on loopback; each run's "
                     "table-only run subtracted.")  # fmt: skip
    return result("plan: campaign fan-out through dataflows.plan", figs, notes=notes,
                  details=data)  # fmt: skip


def digest(quick: bool = False) -> dict[str, Any]:
    """Like events/s through dataflows.digest beside Kafka consume→produce of the same events."""
    from bench import digest as scenario

    events, recipients = (50_000, 10_000) if quick else (1_000_000, 20_000)
    data = _fresh_stack(lambda s: scenario.run(s, events, recipients))
    base = _get(data, "baseline consume->produce rec/s")
    figs = [
        figure("digest events/s, 1 process", _get(data, "digest events/s, 1 process"),
               "events/s", baseline=base, baseline_name=KAFKA, target="≥ 100k/s"),
        figure("digest events/s, 2 processes", _get(data, "digest events/s, 2 processes"),
               "events/s", baseline=base, baseline_name=KAFKA),
        figure("digest events/s, 2 processes, start-up excluded",
               _get(data, "digest events/s, 2 processes, start-up excluded"), "events/s",
               baseline=base, baseline_name=KAFKA, target="≥ 100k/s on 2 cores"),
    ]  # fmt: skip
    notes = [
        f"{events:,} likes on {recipients:,} recipients' posts (active keys), windows "
        "open (ingest rate of the aggregation); the 2-process figure includes start-up, "
        "the same job over an empty topic measures it (subtracted in the last figure)."
    ]
    return result("digest: like events through dataflows.digest", figs, notes=notes,
                  details=data)  # fmt: skip


def _shaping_plot(shaping: dict[str, Any]) -> dict[str, Any]:
    series = shaping.get("series_per_0.5s") or []
    xs = [i * 0.5 for i in range(len(series))]
    return {
        "kind": "lines", "name": "shaping", "xlabel": "s", "ylabel": "sends/s (0.5 s windows)",
        "title": "dispatch: APNs rate achieved vs configured (token bucket)",
        "data": {"achieved": [xs, series]},
        "hlines": {"configured": shaping.get("configured_per_s"),
                   "bound (rate + depth per window)": shaping.get("bound_per_s")},
    }  # fmt: skip


def dispatch(quick: bool = False) -> dict[str, Any]:
    """Provider sends/s per channel beside the bare provider client; APNs shaping."""
    quick_argv = ["--push", "1000", "--other", "300", "--rate", "200"]
    argv = quick_argv if quick else ["--push", "30000", "--other", "1500", "--processes", "2"]
    data = _json_main("bench.dispatch", argv)
    figs = []
    plots: list[dict[str, Any]] = []
    throughput: dict[str, list[list[float]]] = {}
    for channel in ("push", "sms", "email", "inapp"):
        ch = data.get(channel)
        if not ch:
            continue
        raw = ch.get("raw_client", {})
        target = "≥ 10k/s" if channel == "push" else ""
        figs.append(figure(f"{channel} sends/s", ch.get("sends_per_s"), "sends/s",
                           baseline=raw.get("sends_per_s"),
                           baseline_name="bare provider client, same simulator",
                           target=target))  # fmt: skip
        series = ch.get("sends_per_s_series")
        if series:
            throughput[channel] = [list(range(len(series))), series]
    shaping = data.get("shaping")
    if shaping:
        figs.append(figure("shaping: achieved mean rate", shaping.get("achieved_mean_per_s"),
                           "sends/s", baseline=shaping.get("configured_per_s"),
                           baseline_name="configured token-bucket rate",
                           target="within 5 %, never above the bound"))  # fmt: skip
        figs.append(figure("shaping: busiest 0.5 s window", shaping.get("max_window_per_s"),
                           "sends/s", baseline=shaping.get("bound_per_s"),
                           baseline_name="bound rate + depth", better="lower",
                           target="≤ bound"))  # fmt: skip
        plots.append(_shaping_plot(shaping))
    if throughput:
        plots.append({"kind": "lines", "name": "throughput", "xlabel": "s", "ylabel": "sends/s",
                      "title": "dispatch throughput over time (SENDING events per second)",
                      "data": throughput})  # fmt: skip
    notes = [
        f"{data.get('processes', 1)} dispatch process(es); bulk deliveries; budgets far "
        "above the machine except in the shaping run; provider 429s in details."
    ]
    return result("dispatch: provider sends/s against the simulators", figs, notes=notes,
                  plots=plots, details=data)  # fmt: skip


def recovery(quick: bool = False) -> dict[str, Any]:
    """bench/recovery.py (written by the fault-injection work) through its `result()`."""
    module = importlib.import_module("bench.recovery")
    if hasattr(module, "result"):
        res: dict[str, Any] = module.result(quick=quick)
        return res
    raise RuntimeError("bench/recovery.py has no result(quick) function for the runner")
