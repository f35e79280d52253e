"""The whole stack as a user starts it (`herald up`, default settings): SPEC §6's figures.

    python -m bench.fullstack [--users N] [--push-runs R] [--email-users M] [--idle S]
                              [--quick] [--json PATH]

One run, one stack, in this order:

1. **idle**: CPU of every component over `--idle` seconds, starting right after `herald up`;
2. **transactional, idle stack**: 200 OTPs (SMS) at 20/s and 100 password resets (email) at
   10/s through POST /v1/notifications, at random times (Poisson arrivals of that mean rate:
   sent on a fixed 50 ms beat, every OTP of a run met the transactional jobs' 50 ms broker
   fetch wait at about the same phase, and one run's p50 moved between 30 and 55 ms with that
   phase); latency = the time the provider simulator logged the message on its own clock − the
   time the client sent the POST (same machine, same clock);
3. **push campaigns**: R times (3 by default, each once the previous one's events were
   recorded): N new users' contact points on the herald.devices changelog and a segment
   snapshot in ClickHouse (as the demo and a segmentation job write them), one POST to the
   segment; the drain rate at the APNs simulator and CPU by component while it drains. The
   campaign of the median rate is reported, with its per-stage timeline (PLANNED, SENDING,
   PROVIDER_ACCEPTED events per second), and every run's rate beside it: one 50k drain lasts
   ~10 s, and on this shared 2-core machine the same code drained at 4,700-5,700 sends/s
   from one campaign to the next (bench/results/fullstack_ab_session32.md). After each drain,
   how long the hot status (GET /v1/notifications/{id}) took to count every send: the
   receipts job that writes it yields the CPU to the sending path while a campaign runs;
4. **email campaign + password resets**: M users through email (bulk budget = rate − reserved
   of HERALD_DISPATCH_RATES' email), with 100 password resets at 10/s while it saturates the
   same provider;
5. **idle after**: CPU of every component again, once both campaigns drained;
6. **raw baselines** of the same run: Kafka consume→produce of the delivery events, and the
   bare APNs client against the same simulator.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench._fullstack import ComponentCpu, CpuSampler, FullStack, full_stack
from bench._report import figure, per_second, percentile
from bench._report import result as make_result

__all__ = ["main", "result", "run"]

STAGES = ("PLANNED", "SENDING", "PROVIDER_ACCEPTED")
# OTPs and password resets sent first, to users not in the measured set: with 4 partitions
# per deliveries topic, 16 records leave one untouched 4 % of the time
WARM_UP = 16
OTP_TYPE, RESET_TYPE = "otp_login", "password_reset"
# the stack's own work after a campaign: events, receipts, status, dead letters
QUIET_TOPICS = ("herald.delivery-events", "herald.receipts.raw", "herald.dead-letters")
PUSH_RUNS = 3  # push campaigns per run; the median one is reported
STATUS_WAIT_S = 120.0  # longest wait for the hot status to count every send of a campaign


def _say(what: str) -> None:
    print(f"[fullstack {time.strftime('%H:%M:%S')}] {what}", file=sys.stderr, flush=True)


def _transactional(
    stack: FullStack,
    kind: str,
    users: list[str],
    interval: float,
    tag: str,
    nids: dict[str, str] | None = None,
) -> dict[str, float]:
    """POST one `kind` per user, `interval` s apart on average (exponential gaps, seeded);
    {provider address: send time} (and {notification_id: provider address} into `nids`)."""
    gaps = random.Random(tag)
    sent: dict[str, float] = {}
    next_at = time.monotonic()
    for i, user in enumerate(users):
        body: dict[str, Any] = {"request_id": f"{tag}-{kind}-{i}", "notification_type": kind,
                                "recipients": {"user_ids": [user]}}  # fmt: skip
        body["params"] = (
            {"code": f"{i % 1_000_000:06d}"}
            if kind == OTP_TYPE
            else {"reset_url": f"https://example.test/reset/{i}"}
        )
        nid, at = stack.post(body)
        address = _phone(user) if kind == OTP_TYPE else _email(user)
        sent[address] = at
        if nids is not None:
            nids[nid] = address
        next_at += gaps.expovariate(1 / interval)
        time.sleep(max(0.0, next_at - time.monotonic()))
    return sent


def _phone(user: str) -> str:
    return f"+1415{int(user.rsplit('-', 1)[1]):07d}"


def _email(user: str) -> str:
    return f"{user}@t.test"


def _latencies(stack: FullStack, sim: str, sent: dict[str, float], timeout: float) -> list[float]:
    """Provider-clock latency (s) of each message in `sent`, once all arrived (or timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        log = stack.sim_stats(sim, log=True).get("log", [])
        first: dict[str, float] = {}
        for at, address, outcome in log:
            fresh = address in sent and at >= sent[address] - 0.05  # not an earlier run's
            if outcome == "accepted" and fresh and address not in first:
                first[address] = at
        if len(first) == len(sent) or time.monotonic() > deadline:
            return [first[a] - sent[a] for a in sent if a in first]
        time.sleep(1)


def _hops(stack: FullStack, nids: dict[str, str], sent: dict[str, float]) -> dict[str, Any]:
    """p50/p99 ms of each hop of these notifications: POST → PLANNED (API, Kafka, plan) →
    SENDING (Kafka, dispatch's guard and checks) → PROVIDER_ACCEPTED (the provider call)."""
    events = stack.delivery_events(("notification_id", "state", "occurred_at"))
    at: dict[str, dict[str, float]] = {}
    for ev in events:
        if ev["notification_id"] in nids and ev["state"] in STAGES:
            at.setdefault(ev["notification_id"], {}).setdefault(
                ev["state"], ev["occurred_at"].timestamp()
            )
    hops: dict[str, list[float]] = {"POST→PLANNED": [], "PLANNED→SENDING": [],
                                    "SENDING→PROVIDER_ACCEPTED": []}  # fmt: skip
    for nid, times in at.items():
        if len(times) < len(STAGES):
            continue
        hops["POST→PLANNED"].append(times["PLANNED"] - sent[nids[nid]])
        hops["PLANNED→SENDING"].append(times["SENDING"] - times["PLANNED"])
        hops["SENDING→PROVIDER_ACCEPTED"].append(times["PROVIDER_ACCEPTED"] - times["SENDING"])
    return {hop: {"p50": _ms(v, 0.5), "p99": _ms(v, 0.99), "n": len(v)} for hop, v in hops.items()}


def _drain(
    stack: FullStack, sim: str, base: int, n: int, timeout: float
) -> list[tuple[float, int]]:
    """(time, accepted since `base`) every 0.5 s until `n` messages reached `sim`."""
    samples: list[tuple[float, int]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = int(stack.sim_stats(sim)["accepted"]) - base
        samples.append((time.time(), done))
        if done >= n:
            break
        time.sleep(0.5)
    return samples


def _rate(
    samples: list[tuple[float, int]], start: float, last_at: float | None = None
) -> tuple[float | None, float | None]:
    """(sends/s from the POST to the last send, sends/s from the first to the last send).

    `last_at`: the last send's time on the simulator's clock (its stats' `last_accepted_at`),
    else the sample that saw it (up to one sampling interval late)."""
    moving = [(t, n) for t, n in samples if n > 0]
    if not moving:
        return None, None
    t_last, n_last = moving[-1]
    if last_at is not None:
        t_last = min(t_last, last_at)
    t_first = next(t for t, n in samples if n > 0)
    whole = n_last / max(t_last - start, 1e-3)
    steady = n_last / max(t_last - t_first, 1e-3)
    return whole, steady


def _timeline(stack: FullStack, nid: str, start: float) -> dict[str, list[float]]:
    """Events per second of each stage of notification `nid`, from its POST."""
    events = stack.delivery_events(("notification_id", "state", "occurred_at"))
    times: dict[str, list[float]] = {s: [] for s in STAGES}
    for ev in events:
        if ev["notification_id"] == nid and ev["state"] in times:
            times[ev["state"]].append(ev["occurred_at"].timestamp())
    return {s: per_second(ts, start=start) for s, ts in times.items()}


def _lag(timeline: dict[str, list[float]]) -> dict[str, float | None]:
    """Seconds from the POST until each stage reached half of its final count."""
    out: dict[str, float | None] = {}
    for stage, rates in timeline.items():
        total, seen = sum(rates), 0.0
        out[stage] = None
        for second, rate in enumerate(rates):
            seen += rate
            if total and seen >= total / 2:
                out[stage] = float(second)
                break
    return out


def _campaign(
    stack: FullStack, channel: str, users: int, tag: str, cpu: ComponentCpu | None = None
) -> dict[str, Any]:
    """Load an audience of `users` on `channel`, POST one campaign to it, wait for the drain."""
    sim = "apns" if channel == "push" else "email"
    segment = f"{tag}-{channel}-segment"
    _say(f"loading {users:,} {channel} users and segment {segment}")
    stack.load_segment(f"{tag}{channel[0]}", segment, users, channel)
    base = int(stack.sim_stats(sim)["accepted"])
    nid, start = stack.post({
        "request_id": f"{tag}-{channel}-campaign", "notification_type": "marketing_campaign",
        "channels": [channel], "recipients": {"segment_id": segment},
        "params": {"headline": "Spring sale", "offer": "20% off", "cta_url": "https://x.test"},
    })  # fmt: skip
    _say(f"campaign {nid} posted to {users:,} {channel} users")
    if cpu is not None:
        cpu.start()
    samples = _drain(stack, sim, base, users, timeout=max(300.0, users / 200))
    used = cpu.stop() if cpu is not None else {}
    last_at = stack.sim_stats(sim).get("last_accepted_at")
    whole, steady = _rate(samples, start, last_at)
    shown = _status_shown(stack, nid, users, timeout=STATUS_WAIT_S)
    status_lag = shown - (last_at or samples[-1][0]) if shown is not None else None
    return {"nid": nid, "start": start, "samples": samples, "sent": samples[-1][1],
            "users": users, "rate_whole": whole, "rate_steady": steady, "cpu": used,
            "status_lag_s": status_lag}  # fmt: skip


def _status_shown(stack: FullStack, nid: str, n: int, timeout: float) -> float | None:
    """When GET /v1/notifications/{nid} (the hot status a user reads) first counted `n`
    deliveries accepted by the provider (epoch seconds; polled every 0.2 s), None if not within
    `timeout`. Read only once the drain ended: the receipts job writes the hot status, and it
    yields the CPU to the sending path while a campaign saturates the machine."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        summary = stack.notification_status(nid)["summary"]
        if summary.get("PROVIDER_ACCEPTED", 0) >= n:
            return time.time()
        time.sleep(0.2)
    return None


def run(
    users: int, email_users: int, idle_s: float, quick: bool = False, push_runs: int = PUSH_RUNS
) -> dict[str, Any]:
    """Every phase on one stack; raw measurements (see `result_of`)."""
    tag = uuid.uuid4().hex[:6]
    otps = 40 if quick else 200
    resets = 20 if quick else 100
    out: dict[str, Any] = {"users": users, "email_users": email_users, "idle_s": idle_s}
    with tempfile.TemporaryDirectory(prefix="herald-bench-full-") as tmp, full_stack(
        Path(tmp) / "run", env={"HERALD_LOG_LEVEL": "WARNING"}
    ) as stack, CpuSampler() as machine:  # fmt: skip
        components = ComponentCpu(stack.run_dir)
        _say(f"stack up; idle for {idle_s:.0f} s")
        out["idle_start"] = components.measure(idle_s)
        txn_users = [f"t{tag}-{i}" for i in range(max(otps, resets) + WARM_UP)]
        for user in txn_users:
            stack.put_contacts(user, phone=_phone(user), email=_email(user))
        _say("transactional on the idle stack")
        # The first OTPs after start, one at a time: the first record on each partition of a
        # deliveries topic took ~0.5 s longer to reach dispatch (a one-time cost after start,
        # reported apart from the steady latency measured next).
        first = txn_users[-WARM_UP:]
        warm = _transactional(stack, OTP_TYPE, first, 0.1, f"{tag}-warm")
        out["otp_first_s"] = _latencies(stack, "sms_a", warm, 60)
        warm = _transactional(stack, RESET_TYPE, first, 0.1, f"{tag}-warm")
        out["reset_first_s"] = _latencies(stack, "email", warm, 60)
        nids: dict[str, str] = {}
        sent = _transactional(stack, OTP_TYPE, txn_users[:otps], 0.05, f"{tag}-idle", nids)
        out["otp_idle_s"] = _latencies(stack, "sms_a", sent, 60)
        out["otp_idle_hops"] = _hops(stack, nids, sent)
        sent = _transactional(stack, RESET_TYPE, txn_users[:resets], 0.1, f"{tag}-idle")
        out["reset_idle_s"] = _latencies(stack, "email", sent, 60)
        pushes = []
        for i in range(push_runs):
            if i:  # the previous campaign's events recorded, its receipts and statuses written
                stack.quiesce(QUIET_TOPICS)
            pushes.append(_campaign(stack, "push", users, f"{tag}{i}", ComponentCpu(stack.run_dir)))
        out["push_runs"] = [
            {k: p[k] for k in ("nid", "rate_whole", "rate_steady", "cpu", "status_lag_s")}
            for p in pushes
        ]
        push = _median_run(pushes)
        out["push"] = push
        out["push_timeline"] = _timeline(stack, push["nid"], push["start"])
        email_base = int(stack.sim_stats("email")["accepted"])
        stack.load_segment(f"{tag}e", f"{tag}-email-segment", email_users, "email")
        nid, start = stack.post({
            "request_id": f"{tag}-email-campaign", "notification_type": "marketing_campaign",
            "channels": ["email"], "recipients": {"segment_id": f"{tag}-email-segment"},
            "params": {"headline": "Spring sale", "offer": "20% off", "cta_url": "https://x.test"},
        })  # fmt: skip
        _say(f"email campaign {nid} posted; password resets while it drains")
        while int(stack.sim_stats("email")["accepted"]) - email_base < min(500, email_users // 4):
            time.sleep(0.2)
        sent = _transactional(stack, RESET_TYPE, txn_users[:resets], 0.1, f"{tag}-busy")
        samples = _drain(stack, "email", email_base, email_users + resets, timeout=600)
        out["reset_busy_s"] = _latencies(stack, "email", sent, 60)
        whole, steady = _rate(samples, start, stack.sim_stats("email").get("last_accepted_at"))
        out["email"] = {"nid": nid, "start": start, "samples": samples, "rate_whole": whole,
                        "rate_steady": steady, "budget": stack.bulk_budget("email")}  # fmt: skip
        out["email_timeline"] = _timeline(stack, nid, start)
        out["quiesce_s"] = stack.quiesce(QUIET_TOPICS)
        _say(f"work in flight done after {out['quiesce_s']:.0f} s; idle again for {idle_s:.0f} s")
        out["idle_after"] = components.measure(idle_s)
        _say("raw baselines")
        out["kafka_baseline"] = stack.kafka_baseline(20_000 if quick else 100_000)
        out["apns_client"] = stack.bare_client("push", 2_000 if quick else 20_000)
        out["machine_cpu"] = [(round(t - out["push"]["start"], 1), b) for t, b in machine.samples]
    return out


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of the median drain rate (POST → last send); the lower middle one of an even
    number."""
    ranked = sorted(runs, key=lambda r: r["rate_whole"] or 0.0)
    return ranked[(len(ranked) - 1) // 2]


def _ms(values: list[float], p: float) -> float | None:
    v = percentile([x * 1000 for x in values], p)
    return round(v, 1) if v is not None else None


def result_of(raw: dict[str, Any]) -> dict[str, Any]:
    """Figures, notes and plots from `run`'s measurements."""
    push, email = raw["push"], raw["email"]
    runs = raw.get("push_runs") or [push]
    idle0, idle1 = raw["idle_start"], raw["idle_after"]
    figures = [
        figure("idle stack CPU after start", idle0["total"], "% of one core", better="lower",
               target="≤ 20"),
        figure("idle stack CPU after both campaigns", idle1["total"], "% of one core",
               better="lower", target="≤ 20"),
        figure(f"push campaign drain at APNs ({push['users']:,} users, POST → last send; "
               f"median of {len(runs)})",
               push["rate_whole"], "sends/s", baseline=raw["apns_client"]["sends_per_s"],
               baseline_name="bare APNs client, same simulator", target="≥ 5,000"),
        figure("push campaign drain, first → last send", push["rate_steady"], "sends/s",
               baseline=raw["apns_client"]["sends_per_s"],
               baseline_name="bare APNs client, same simulator"),
        figure(f"email campaign drain ({raw['email_users']:,} users)", email["rate_steady"],
               "sends/s", baseline=email["budget"], baseline_name="bulk email budget",
               target="≥ 95 % of budget"),
        figure("OTP accept → SMS provider, idle, p50", _ms(raw["otp_idle_s"], 0.5), "ms",
               better="lower", target="≤ 50"),
        figure("OTP accept → SMS provider, idle, p99", _ms(raw["otp_idle_s"], 0.99), "ms",
               better="lower", target="≤ 250"),
        figure("password reset → email provider, idle, p99", _ms(raw["reset_idle_s"], 0.99),
               "ms", better="lower", target="≤ 250"),
        figure("password reset → email provider during the email campaign, p50",
               _ms(raw["reset_busy_s"], 0.5), "ms", better="lower"),
        figure("password reset → email provider during the email campaign, p99",
               _ms(raw["reset_busy_s"], 0.99), "ms", better="lower", target="≤ 500"),
        figure("password reset during the email campaign, max", _ms(raw["reset_busy_s"], 1.0),
               "ms", better="lower"),
        figure("Kafka consume→produce, same broker", raw["kafka_baseline"]["records_per_s"],
               "records/s"),
    ]  # fmt: skip
    notes = [
        "idle CPU by component after start (% of one core): " + _top(idle0["by_component"]),
        f"idle CPU by component after the campaigns (measured once no event, receipt or dead "
        f"letter had been added for 5 s and receipts and warehouse had committed every event: "
        f"{raw['quiesce_s']:.0f} s after the email campaign drained): "
        + _top(idle1["by_component"]),
        f"push campaigns, each to {push['users']:,} new users once the previous one's events "
        "were recorded (sends/s POST → last send / first → last send): "
        + ", ".join(f"{r['rate_whole']:,.0f} / {r['rate_steady']:,.0f}" for r in runs)
        + "; the median one is reported, with its timeline",
        "the hot status (GET /v1/notifications/{id}) counted every delivery accepted by APNs "
        "this long after the campaign's last send (s; polled every 0.2 s): "
        + ", ".join(_seconds(r.get("status_lag_s")) for r in runs),
        "CPU by component while the median push campaign drained: "
        + _top(push["cpu"].get("by_component", {})),
        f"OTP hops on the idle stack (ms, Herald's event times): {raw['otp_idle_hops']}",
        f"push stage lag (s from the POST until half of the stage's events): "
        f"{_lag(raw['push_timeline'])}",
        "the first OTPs and password resets after start (about one every 0.1 s, before the "
        f"measured ones), accept → provider ms: {[round(x * 1000) for x in raw['otp_first_s']]}"
        f" and {[round(x * 1000) for x in raw['reset_first_s']]}",
        f"transactional messages measured: {len(raw['otp_idle_s'])} OTPs idle, "
        f"{len(raw['reset_idle_s'])} + {len(raw['reset_busy_s'])} password resets "
        "(idle + during the email campaign); latency on the provider simulator's clock",
    ]
    plots = [
        _stage_plot("fullstack_push_stages", f"Push campaign to {push['users']:,} users",
                    raw["push_timeline"], {}),
        _stage_plot("fullstack_email_stages", f"Email campaign to {raw['email_users']:,} users",
                    raw["email_timeline"], {"bulk email budget": email["budget"]}),
        {"kind": "hist", "name": "fullstack_transactional_latency",
         "title": "Transactional accept → provider (provider's clock)", "xlabel": "ms",
         "data": {"OTP, idle": [x * 1000 for x in raw["otp_idle_s"]],
                  "password reset, idle": [x * 1000 for x in raw["reset_idle_s"]],
                  "password reset, email campaign": [x * 1000 for x in raw["reset_busy_s"]]}},
    ]  # fmt: skip
    return make_result(
        "Whole stack (herald up, default settings)",
        figures,
        notes=notes,
        plots=plots,
        details={k: v for k, v in raw.items() if k != "machine_cpu"},
    )


def _stage_plot(
    name: str, title: str, timeline: dict[str, list[float]], hlines: dict[str, float]
) -> dict[str, Any]:
    data = {stage: [list(range(len(r))), r] for stage, r in timeline.items()}
    return {"kind": "lines", "name": name, "title": f"{title}: events per second by stage",
            "xlabel": "s since the POST", "ylabel": "events/s", "data": data,
            "hlines": hlines}  # fmt: skip


def _seconds(value: float | None) -> str:
    return f"not within {STATUS_WAIT_S:.0f} s" if value is None else f"{value:.1f}"


def _top(by: dict[str, float], n: int = 8) -> str:
    items = sorted(by.items(), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{k} {v:.1f}" for k, v in items) or "—"


def result(quick: bool = False) -> dict[str, Any]:
    """The runner's entry point (bench/__main__.py)."""
    if quick:
        return result_of(run(users=2_000, email_users=500, idle_s=10, quick=True, push_runs=1))
    return result_of(run(users=50_000, email_users=20_000, idle_s=60))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.fullstack",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--users", type=int, default=50_000, help="push campaign audience")
    parser.add_argument(
        "--push-runs", type=int, default=PUSH_RUNS,
        help=f"push campaigns, the median one reported (default {PUSH_RUNS}; 1 for a 1M one)",
    )  # fmt: skip
    parser.add_argument("--email-users", type=int, default=20_000, help="email campaign audience")
    parser.add_argument("--idle", type=float, default=60.0, help="seconds of each idle window")
    parser.add_argument(
        "--quick", action="store_true", help="2,000 + 500 users, 10 s idle windows (a smoke run)"
    )
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args(argv)
    if args.quick:
        args.users, args.email_users, args.idle, args.push_runs = 2_000, 500, 10.0, 1
    if args.push_runs < 1:
        parser.error("--push-runs must be at least 1")
    raw = run(args.users, args.email_users, args.idle, quick=args.quick, push_runs=args.push_runs)
    res = result_of(raw)
    for fig in res["figures"]:
        base = (
            f"  (baseline {fig['baseline']:.0f}: {fig['baseline_name']})"
            if fig.get("baseline")
            else ""
        )
        print(f"{fig['name']}: {fig['value']} {fig['unit']}{base}")
    for note in res["notes"]:
        print("-", note)
    if args.json:
        args.json.write_text(json.dumps(res, default=str, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
