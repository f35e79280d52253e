"""HTTP transports of the provider clients: Herald's own against maintained clients, same run.

    python -m bench.transports [--quick]

Herald's provider clients run by default on its own HTTP/2 transport (sinks/providers/
h2transport.py, h2connection.py) and, for HTTP/1.1, on aiohttp (httpx-aiohttp): Herald's own
HTTP/1.1 transport was deleted once this benchmark showed aiohttp faster for less CPU. This
measures, against the APNs simulator (HTTP/2 over TLS) and the SendGrid-shaped simulator
(HTTP/1.1), the same provider client (`sinks.dispatch.clients.default_factories`) on each
transport of `HttpConfig.transport`, the default of each protocol as the baseline: `lean`
(Herald's HTTP/2) or `aiohttp`, against `httpcore` (httpx's own) and `pyreqwest` (Rust reqwest
under httpx). Each figure is sends/s and the
client process's CPU per send (the simulator's excluded), 1,000 in flight, after a warm-up;
the transports take turns over three rounds and the median round counts (the machine is
shared). The decision the table leads to is in the README (Performance, Components).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import _report
from bench._report import figure

# channel -> transports measured, the default first (the baseline); aiohttp speaks HTTP/1.1
# only, Herald's own transport (`lean`) HTTP/2 only
TRANSPORTS = {
    "push": ("lean", "httpcore", "pyreqwest"),
    "email": ("aiohttp", "httpcore", "pyreqwest"),
}
BASELINE_NAME = {"lean": "Herald's own transport (default)", "aiohttp": "aiohttp (default)"}
ENV_PREFIX = {"push": "HERALD_APNS_", "email": "HERALD_SENDGRID_"}
SIMULATOR = {"push": "apns", "email": "email"}
ROUNDS = 3
# What these figures decided (bench/results/transports.md has the first run, with Herald's own
# HTTP/1.1 transport beside aiohttp); each run shows whether its figures still support it.
DECISION = (
    "decision, HTTP/2 (APNs, FCM): Herald's own transport stays (sinks/providers/h2transport.py, "
    "HPACK by jh2's public API, GOAWAY, RST_STREAM and CONTINUATION tested in "
    "tests/sinks/providers/test_h2frames.py): no maintained client under httpx comes near its "
    "sends/s or its CPU per send (the ratios above)",
    "decision, HTTP/1.1 (Twilio, Vonage, SendGrid, MessageBird): aiohttp under httpx "
    "(httpx-aiohttp), a maintained client, is the default; it matched Herald's own HTTP/1.1 "
    "transport in the first run, which was then removed",
)


def _one(channel: str, transport: str, credentials: dict[str, Any], n: int) -> dict[str, Any]:
    """One measurement in a fresh process (its own event loop, imports and pools)."""
    code = (
        "import json, sys; from bench.dispatch import raw_client_with; "
        "a = json.loads(sys.argv[1]); "
        "print(json.dumps(raw_client_with(a['channel'], a['env'], 'redis://127.0.0.1:1', a['n'])))"
    )
    from sinks.dispatch.simenv import client_env

    env = client_env(SIMULATOR[channel], credentials)
    env[f"{ENV_PREFIX[channel]}TRANSPORT"] = transport
    arg = json.dumps({"channel": channel, "env": env, "n": n})
    repo = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", code, arg], cwd=repo, capture_output=True, text=True, timeout=600
    )
    if out.returncode != 0:
        raise RuntimeError(f"{channel}/{transport}: {out.stderr.strip()[-500:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def measure(quick: bool = False) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """channel -> transport -> one result per round (sends, sends_per_s, cpu_us_per_send)."""
    from infra.simulators.launcher import start_simulator

    sizes = {"push": 2_000 if quick else 20_000, "email": 500 if quick else 5_000}
    out: dict[str, dict[str, list[dict[str, Any]]]] = {c: {} for c in TRANSPORTS}
    with tempfile.TemporaryDirectory(prefix="herald-transports-") as tmp:
        sims = {c: start_simulator(SIMULATOR[c], Path(tmp) / c, config={"record_ids": False})
                for c in TRANSPORTS}  # fmt: skip
        try:
            for _round in range(1 if quick else ROUNDS):
                for channel, transports in TRANSPORTS.items():
                    creds = sims[channel].credentials()
                    for transport in transports:
                        res = _one(channel, transport, creds, sizes[channel])
                        out[channel].setdefault(transport, []).append(res)
        finally:
            for sim in sims.values():
                sim.stop()
    return out


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in runs))


def result_of(raw: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Sends/s and CPU per send of each transport, the protocol's default as the baseline."""
    figures = []
    protocol = {"push": "APNs, HTTP/2", "email": "SendGrid, HTTP/1.1"}
    for channel, by_transport in raw.items():
        default = TRANSPORTS[channel][0]
        base, base_name = by_transport[default], BASELINE_NAME[default]
        for transport, runs in by_transport.items():
            if transport == default:
                continue
            name = f"{protocol[channel]}: {transport}"
            figures.append(figure(
                f"{name}, sends/s", _median(runs, "sends_per_s"), "sends/s",
                baseline=_median(base, "sends_per_s"), baseline_name=base_name,
            ))  # fmt: skip
            figures.append(figure(
                f"{name}, client CPU per send", _median(runs, "cpu_us_per_send"), "µs",
                baseline=_median(base, "cpu_us_per_send"), baseline_name=base_name,
                better="lower",
            ))  # fmt: skip
    notes = [
        f"median of {len(next(iter(raw['push'].values())))} rounds, transports taking turns; "
        "the same provider client on each; 1,000 in flight; the simulator's CPU not counted",
        "every round: "
        + "; ".join(
            f"{c}/{t} "
            + ", ".join(f"{r['sends_per_s']:,}/s {r['cpu_us_per_send']} µs" for r in runs)
            for c, by in raw.items()
            for t, runs in by.items()
        ),  # fmt: skip
        *DECISION,
    ]
    return _report.result(
        "Provider HTTP transports: the defaults beside maintained clients",
        figures, notes=notes, details={"runs": raw},
    )  # fmt: skip


def result(quick: bool = False) -> dict[str, Any]:
    """The scenario for `python -m bench` (bench/__main__.py)."""
    return result_of(measure(quick))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small volumes, one round")
    args = parser.parse_args()
    raw = measure(args.quick)
    for channel, by in raw.items():
        for transport, runs in by.items():
            print(f"{channel:5} {transport:9} "
                  f"{_median(runs, 'sends_per_s'):>8,.0f} sends/s "
                  f"{_median(runs, 'cpu_us_per_send'):>6,.0f} µs CPU/send "
                  f"(rounds: {[r['sends_per_s'] for r in runs]})")  # fmt: skip


if __name__ == "__main__":
    main()
