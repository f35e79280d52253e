"""OTP accept → provider-submit latency while a bulk campaign saturates the machine.

    python -m bench.otp_latency [--users N] [--otps K] [--interval S] [--quick]

Starts the FULL stack (`herald up --detach`, every job its own process, provider simulators)
in a temp dir, then:

1. **Idle baseline**: K OTPs (otp_login, SMS) through POST /v1/notifications, one every S
   seconds, to K users whose phones were registered through the API, with nothing else running.
2. **Under load**: a bulk campaign (marketing_campaign, push + email) to N users is posted
   through the API in requests of 1,000 users; once it is planning, the same K OTPs (same
   users, new request ids) at the same pace while plan_bulk, dispatch_bulk_push,
   dispatch_bulk_email, receipts and warehouse compete for the 2 cores.

Latency = PROVIDER_ACCEPTED event time (the SMS provider answered the submit) − the instant
the client sent the POST, so it includes the API, Kafka, plan_transactional and
dispatch_transactional. Machine CPU busy during each phase shows the load was real. Campaign
contact points go straight into herald.devices (see bench/_fullstack.py).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench._fullstack import CpuSampler, FullStack, full_stack
from bench._report import figure, per_second, percentile
from bench._report import result as make_result

__all__ = ["main", "result", "result_of", "run"]


def _say(what: str) -> None:
    print(f"[otp_latency {time.strftime('%H:%M:%S')}] {what}", flush=True)


def _otps(stack: FullStack, users: list[str], interval: float, tag: str) -> dict[str, float]:
    """One OTP per user, paced; {notification_id: epoch s of the send}."""
    sent: dict[str, float] = {}
    start = time.monotonic()
    for i, user in enumerate(users):
        delay = start + i * interval - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        nid, at = stack.post({
            "request_id": f"otp-{tag}-{i}", "notification_type": "otp_login",
            "recipients": {"user_ids": [user]}, "params": {"code": f"{100000 + i}"},
        })  # fmt: skip
        sent[nid] = at
    return sent


def _warm_up(stack: FullStack, users: list[str], tag: str, timeout: float = 90) -> None:
    """OTPs until one reaches the provider: first batches pay for connections and JIT warm-up."""
    sent = _otps(stack, users, 0.2, f"{tag}-warm")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = stack.delivery_events(("notification_id", "state", "occurred_at"))
        if len(_latencies(events, sent)) == len(sent):
            return
        time.sleep(1)


def _campaign(stack: FullStack, users: int, run: str) -> list[str]:
    """The bulk campaign through the API, 1,000 inline users per request."""
    nids = []
    for n in range(0, users, 1000):
        ids = [f"c{run}-{i}" for i in range(n, min(n + 1000, users))]
        nid, _ = stack.post({
            "request_id": f"campaign-{run}-{n}", "notification_type": "marketing_campaign",
            "recipients": {"user_ids": ids},
            "params": {"headline": "Spring sale", "offer": "20% off", "cta_url": "https://x.test"},
        })  # fmt: skip
        nids.append(nid)
    return nids


def _latencies(events: list[dict[str, Any]], sent: dict[str, float]) -> dict[str, float]:
    """Seconds from send to the first PROVIDER_ACCEPTED of each OTP."""
    out: dict[str, float] = {}
    for ev in events:
        nid = ev["notification_id"]
        if ev["state"] == "PROVIDER_ACCEPTED" and nid in sent:
            lat = ev["occurred_at"].timestamp() - sent[nid]
            out[nid] = min(out.get(nid, lat), lat)
    return out


def run(users: int, otps: int, interval: float) -> dict[str, Any]:
    """Both phases on one full stack; raw measurements (see result_of for the figures)."""
    tag = uuid.uuid4().hex[:6]
    otp_users = [f"otp-{tag}-{i}" for i in range(otps)]
    _say("starting the full stack")
    with tempfile.TemporaryDirectory(prefix="herald-bench-otp-") as tmp, full_stack(
        Path(tmp) / "run"
    ) as stack, CpuSampler() as cpu:  # fmt: skip
        _say("stack up; registering phones and campaign contact points")
        for i, user in enumerate(otp_users):
            stack.put_phone(user, f"+1415555{i % 10_000:04d}")
        stack.produce_contact_points(f"c{tag}-{i}" for i in range(users))
        time.sleep(5)  # plan learns contact points from the changelog (README, known limits)
        _say("warm-up: first OTPs through freshly started jobs")
        _warm_up(stack, otp_users[:2], tag)
        _say("idle phase")
        t_idle = time.time()
        idle = _otps(stack, otp_users, interval, f"{tag}-idle")
        t_idle_end = time.time()
        time.sleep(3)
        _say("posting the campaign")
        t_campaign = time.time()
        _campaign(stack, users, tag)
        deadline = time.monotonic() + 60
        while stack.sim_stats("fcm")["accepted"] < min(users // 10, 2_000):
            if time.monotonic() > deadline:  # measured anyway; the figures will show it
                break
            time.sleep(0.5)  # until the campaign reaches the providers: fully busy from here
        _say("busy phase")
        t_busy = time.time()
        busy = _otps(stack, otp_users, interval, f"{tag}-busy")
        t_busy_end = time.time()
        _say("waiting for every OTP to reach the provider")
        deadline = time.monotonic() + 60
        while True:  # until every OTP reached the provider (or a minute passed)
            events = stack.delivery_events(("notification_id", "state", "occurred_at",
                                            "traffic_class", "channel", "reason"))  # fmt: skip
            lat_idle, lat_busy = _latencies(events, idle), _latencies(events, busy)
            if len(lat_idle) + len(lat_busy) == 2 * otps or time.monotonic() > deadline:
                break
            time.sleep(3)
        stats = stack.sim_stats("sms_a")
    bulk = [ev["occurred_at"].timestamp() for ev in events
            if ev["traffic_class"] == "bulk" and ev["state"] == "PROVIDER_ACCEPTED"]  # fmt: skip
    bulk_states: dict[str, int] = {}
    for ev in events:
        if ev["traffic_class"] == "bulk":
            key = f"{ev['channel'] or '-'} {ev['state']} {ev['reason'] or ''}".strip()
            bulk_states[key] = bulk_states.get(key, 0) + 1
    return {
        "users": users, "otps": otps, "interval_s": interval, "bulk_events": bulk_states,
        "idle_s": [lat_idle[n] for n in idle if n in lat_idle],
        "busy_s": [lat_busy[n] for n in busy if n in lat_busy],
        "cpu_idle_phase": cpu.mean(t_idle, t_idle_end),
        "cpu_busy_phase": cpu.mean(t_busy, t_busy_end),
        "cpu": [(round(t - t_campaign, 2), round(b, 3)) for t, b in cpu.samples],
        "bulk_accepted_per_s": per_second(bulk, start=t_campaign),
        "bulk_accepted": len(bulk), "busy_window_s": [0.0, round(t_busy_end - t_campaign, 2)],
        "sms_a_accepted": stats.get("accepted"),
    }  # fmt: skip


def result_of(raw: dict[str, Any]) -> dict[str, Any]:
    """Figures (busy beside idle), notes and plots from `run`'s measurements."""
    idle = [x * 1000 for x in raw["idle_s"]]
    busy = [x * 1000 for x in raw["busy_s"]]
    base = "same OTPs, idle pipeline"
    figs = []
    for p, target in ((0.5, ""), (0.99, "< 2,000 ms (seed)")):
        figs.append(figure(f"OTP accept→provider p{int(p * 100)} during the campaign",
                           percentile(busy, p), "ms", baseline=percentile(idle, p),
                           baseline_name=base, better="lower", target=target))  # fmt: skip
    figs.append(figure("OTP accept→provider max during the campaign", max(busy, default=None),
                       "ms", baseline=max(idle, default=None), baseline_name=base,
                       better="lower"))  # fmt: skip
    figs.append(
        figure(
            "OTPs that reached the provider",
            float(len(busy)),
            "OTPs",
            baseline=float(len(idle)),
            baseline_name=f"of {raw['otps']} sent each",
        )
    )
    cpu_b, cpu_i = raw["cpu_busy_phase"], raw["cpu_idle_phase"]
    figs.append(figure("machine CPU busy during the OTP phase",
                       None if cpu_b is None else cpu_b * 100, "%",
                       baseline=None if cpu_i is None else cpu_i * 100,
                       baseline_name="idle phase"))  # fmt: skip
    notes = [
        f"Full stack (`herald up`); campaign of {raw['users']:,} users (push + email) posted "
        f"through the API; {raw['otps']} OTPs one every {raw['interval_s']} s in each phase.",
        f"Bulk deliveries accepted by providers while measured: {raw['bulk_accepted']:,}.",
    ]
    if cpu_i is not None and cpu_i > 0.8:
        notes.append(
            f"The idle baseline was not idle: other work kept the machine {cpu_i:.0%} busy "
            "during it, so busy vs idle compares two loaded pipelines (rerun on a quiet machine)."
        )
    bulk = raw["bulk_accepted_per_s"]
    plots = [
        {"kind": "hist", "name": "latency", "xlabel": "ms (POST sent → SMS provider accepted)",
         "title": "OTP accept→provider latency: during a bulk campaign vs idle",
         "data": {"during the campaign": busy, "idle pipeline": idle}},
        {"kind": "lines", "name": "campaign", "xlabel": "s since the campaign was posted",
         "ylabel": "deliveries/s", "title": "bulk campaign throughput (provider-accepted/s)",
         "data": {"bulk provider-accepted/s": [list(range(len(bulk))), bulk]}},
        {"kind": "lines", "name": "cpu", "xlabel": "s since the campaign was posted",
         "ylabel": "% busy (all cores)", "title": "machine CPU busy (idle phase before 0)",
         "data": {"CPU busy %": [[t for t, _ in raw["cpu"]], [b * 100 for _, b in raw["cpu"]]]}},
    ]  # fmt: skip
    title = "OTP accept→provider-submit latency while a bulk campaign saturates the machine"
    return make_result(title, figs, notes=notes, plots=plots,
                  details={k: v for k, v in raw.items() if k not in ("cpu",)})  # fmt: skip


QUICK, FULL = (2_000, 8, 0.5), (20_000, 30, 0.5)  # users, OTPs per phase, seconds between OTPs


def result(quick: bool = False) -> dict[str, Any]:
    """The runner's entry point (bench/__main__.py)."""
    return result_of(run(*(QUICK if quick else FULL)))


def main(argv: list[str] | None = None) -> int:
    """Run on a fresh full stack and print the figures."""
    parser = argparse.ArgumentParser(prog="python -m bench.otp_latency", description=__doc__)
    parser.add_argument("--users", type=int, default=FULL[0], help="campaign recipients")
    parser.add_argument("--otps", type=int, default=FULL[1], help="OTPs per phase")
    parser.add_argument("--interval", type=float, default=FULL[2], help="seconds between OTPs")
    parser.add_argument("--quick", action="store_true", help="small volumes")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `finally`: the stack stops
    params = QUICK if args.quick else (args.users, args.otps, args.interval)
    res = result_of(run(*params))
    for fig in res["figures"]:
        print(json.dumps(fig))
    for note in res["notes"]:
        print(note)
    print(json.dumps(res["details"]["bulk_events"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
