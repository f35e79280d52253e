"""A plan job killed under OTP traffic, with 100k and 1M users loaded (issue 19).

    python -m bench.restart [--users 100000 1000000] [--quick] [--json FILE]

For each user count, on its own fresh stack (`herald up --detach`, default settings, as
bench/fullstack.py starts it):

1. **load**: N users' contact points straight onto the compacted herald.devices topic (a bulk
   import); wait until the users job's Redis copies hold them (its positions at the topic's
   end, dataflows/users.py). Resident memory of the plan jobs, the users job and Redis is read
   then, and the plan jobs' again after the OTPs;
2. **OTPs**: 200 OTP requests at 20/s through POST /v1/notifications, one user and phone each
   (registered through the API before), and `plan_transactional` SIGKILLed after the 60th;
   the supervisor restarts it. Latency = the time the SMS provider simulator logged the
   message minus the time the request was sent (both on this machine's clock);
3. **restart to first plan**: from the start of the new plan_transactional process to the
   first OTP posted after the kill reaching the provider (the OTPs queued while it was down
   are planned by its first batch).

The figures that must not move with N: restart-to-first-plan, the OTP p99 around the kill and
the plan jobs' memory (a plan job holds no user table: it reads each chunk's users from the
Redis copies, dataflows/_user_copies.py).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._fullstack import FullStack, full_stack
from bench._report import figure, percentile
from bench._report import result as make_result
from bench.fullstack import OTP_TYPE, _phone
from dataflows.users import wait_copied

OTPS, RATE, KILL_AFTER = 200, 20.0, 60
PLAN_JOBS = ("plan_transactional", "plan_normal", "plan_bulk")
SMS_SIMS = ("sms_a", "sms_b")


def _say(what: str) -> None:
    print(f"[restart {time.strftime('%H:%M:%S')}] {what}", file=sys.stderr, flush=True)


def _rss_mb(pid: int) -> float:
    """Resident memory (MB) of a process and its children."""
    from bench._fullstack import ComponentCpu

    total = 0
    for p in ComponentCpu._tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return round(total / 1024, 1)


def _pids(stack: FullStack) -> dict[str, int]:
    from infra.stack import read_state

    state = read_state(stack.run_dir) or {}
    return {n: int(c["pid"]) for n, c in state.get("components", {}).items() if c.get("pid")}


def _redis_mb(stack: FullStack) -> float:
    import redis

    hot = redis.Redis.from_url(stack.state["env"]["HERALD_REDIS_URL"])
    try:
        return round(int(hot.info("memory")["used_memory"]) / 2**20, 1)
    finally:
        hot.close()


def _otp_stream(
    stack: FullStack, users: list[str], tag: str, before: Callable[[int], None]
) -> dict[str, float]:
    """One OTP per user at RATE/s (`before(i)` runs before the i-th); {phone: time sent}."""
    sent: dict[str, float] = {}
    next_at = time.monotonic()
    for i, user in enumerate(users):
        before(i)
        body = {"request_id": f"{tag}-{i}", "notification_type": OTP_TYPE,
                "recipients": {"user_ids": [user]}, "params": {"code": f"{i:06d}"}}  # fmt: skip
        _nid, at = stack.post(body)
        sent[_phone(user)] = at
        next_at += 1 / RATE
        time.sleep(max(0.0, next_at - time.monotonic()))
    return sent


def _otps_with_kill(stack: FullStack, users: list[str], tag: str) -> dict[str, Any]:
    """OTPS at RATE/s, plan_transactional SIGKILLed after KILL_AFTER of them (module doc)."""
    from infra.stackclient import StackClient

    client = StackClient.from_run_dir(stack.run_dir)
    killed: dict[str, float] = {}

    def kill() -> None:
        old = client.kill("plan_transactional")
        killed["at"] = time.time()
        client.wait_restarted("plan_transactional", old, timeout=120)
        killed["restarted"] = time.time()

    killer = threading.Thread(target=kill, daemon=True)

    def before(i: int) -> None:
        if i == min(KILL_AFTER, len(users) // 3):
            killer.start()

    sent = _otp_stream(stack, users, tag, before)
    if killer.is_alive():
        killer.join(timeout=150)
    client.close()
    arrived = _arrivals(stack, sent, timeout=90)
    t_kill = killed.get("at", float("nan"))
    before = [arrived[a] - s for a, s in sent.items() if a in arrived and s < t_kill]
    after = [arrived[a] - s for a, s in sent.items() if a in arrived and s >= t_kill]
    first_after = min((arrived[a] for a, s in sent.items() if a in arrived and s >= t_kill),
                      default=None)  # fmt: skip
    restarted = killed.get("restarted")
    return {
        "sent": len(sent),
        "reached": len(arrived),
        "before_kill_s": before,
        "after_kill_s": after,
        "kill_to_restart_s": None if restarted is None else round(restarted - t_kill, 2),
        "restart_to_first_plan_s": (
            None if restarted is None or first_after is None else round(first_after - restarted, 2)
        ),
    }


def _otps_with_dispatch_kills(stack: FullStack, users: list[str], tag: str) -> dict[str, Any]:
    """OTPS at RATE/s, dispatch_transactional SIGKILLed after the 60th and the 130th: per kill,
    the OTPs in flight (posted, not yet at a provider) and the duplicates among them."""
    from infra.stackclient import StackClient

    client = StackClient.from_run_dir(stack.run_dir)
    kills: list[float] = []
    at_kill = {min(KILL_AFTER, len(users) // 3), min(130, 2 * len(users) // 3)}

    def before(i: int) -> None:
        if i in at_kill:
            old = client.kill("dispatch_transactional")
            kills.append(time.time())
            threading.Thread(
                target=client.wait_restarted, args=("dispatch_transactional", old, 120),
                daemon=True,
            ).start()  # fmt: skip

    sent = _otp_stream(stack, users, tag, before)
    client.close()
    arrived = _arrivals(stack, sent, timeout=120)
    copies: dict[str, int] = {}
    for sim in SMS_SIMS:
        for at, address, outcome in stack.sim_stats(sim, log=True).get("log", []):
            if outcome == "accepted" and address in sent and at >= sent[address] - 0.05:
                copies[address] = copies.get(address, 0) + 1
    # a duplicate belongs to the kill nearest its first copy's arrival (its answer was lost
    # with the killed process: just before the kill, or in the socket at it)
    nearest = {a: min(range(len(kills)), key=lambda i: abs(arrived[a] - kills[i]))
               for a, n in copies.items() if n > 1 and a in arrived and kills}  # fmt: skip
    per_kill = []
    for i, t in enumerate(kills):
        in_flight = [a for a, s in sent.items() if s < t and arrived.get(a, float("inf")) > t]
        dups = [a for a, k in nearest.items() if k == i]
        per_kill.append({"in_flight": len(in_flight), "duplicates": len(dups)})
    latencies = [arrived[a] - s for a, s in sent.items() if a in arrived]
    return {
        "sent": len(sent),
        "reached": len(arrived),
        "duplicates": sum(1 for n in copies.values() if n > 1),
        "per_kill": per_kill,
        "latency_s": latencies,
    }


def _arrivals(stack: FullStack, sent: dict[str, float], timeout: float) -> dict[str, float]:
    """{phone: when an SMS provider first accepted a message to it}, once every phone in
    `sent` has one (or at the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        arrived: dict[str, float] = {}
        for sim in SMS_SIMS:
            for at, address, outcome in stack.sim_stats(sim, log=True).get("log", []):
                fresh = address in sent and at >= sent[address] - 0.05
                if outcome == "accepted" and fresh:
                    arrived[address] = min(at, arrived.get(address, at))
        if len(arrived) == len(sent) or time.monotonic() > deadline:
            return arrived
        time.sleep(1)


def run_one(users: int, quick: bool = False, with_dispatch_kills: bool = False) -> dict[str, Any]:
    """One stack, `users` loaded, the OTP traffic with the kill(s)."""
    tmp = tempfile.mkdtemp(prefix="herald-restart-")
    try:
        return _run_one(Path(tmp), users, quick, with_dispatch_kills)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run_one(tmp: Path, users: int, quick: bool, with_dispatch_kills: bool) -> dict[str, Any]:
    with full_stack(tmp / "run", env={"HERALD_LOG_LEVEL": "INFO"}) as stack:
        _say(f"loading {users:,} users onto herald.devices")
        t0 = time.monotonic()
        stack.produce_contact_points((f"bulk-{i}" for i in range(users)), wait=False)
        produce_s = round(time.monotonic() - t0, 1)
        copies_s = round(wait_copied(stack.settings, timeout=1800), 1)
        _say(f"copies hold them {copies_s} s after the produce ({produce_s} s)")
        time.sleep(5)
        pids = _pids(stack)
        rss = {job: _rss_mb(pids[job]) for job in (*PLAN_JOBS, "users") if job in pids}
        redis_mb = _redis_mb(stack)
        otp_users = [f"otp-{i}" for i in range(OTPS if not quick else 40)]
        for user in otp_users:
            stack.put_phone(user, _phone(user))
        _say("OTP traffic, plan_transactional killed after the 60th")
        otp = _otps_with_kill(stack, otp_users, f"restart-{users}")
        dispatch = None
        if with_dispatch_kills:
            d_users = [f"otpd-{1000 + i}" for i in range(len(otp_users))]
            for user in d_users:
                stack.put_phone(user, _phone(user))
            _say("OTP traffic, dispatch_transactional killed twice")
            dispatch = _otps_with_dispatch_kills(stack, d_users, f"dkill-{users}")
        pids = _pids(stack)
        rss_after = {job: _rss_mb(pids[job]) for job in PLAN_JOBS if job in pids}
        return {"users": users, "produce_s": produce_s, "copies_s": copies_s,
                "rss_mb": rss, "rss_after_mb": rss_after, "redis_mb": redis_mb,
                "dispatch_kills": dispatch, **otp}  # fmt: skip


def run(user_counts: list[int], quick: bool = False) -> dict[str, Any]:
    return {"runs": [run_one(n, quick, with_dispatch_kills=i == 0)
                     for i, n in enumerate(user_counts)]}  # fmt: skip


def _ms(values: list[float], p: float) -> float | None:
    v = percentile([x * 1000 for x in values], p)
    return round(v, 1) if v is not None else None


def result_of(raw: dict[str, Any]) -> dict[str, Any]:
    figures = []
    notes = []
    for r in raw["runs"]:
        n = f"{r['users']:,} users"
        figures += [
            figure(f"{n}: restart → first OTP planned and at the provider",
                   r["restart_to_first_plan_s"], "s", better="lower",
                   target="the same at 100k and 1M"),
            figure(f"{n}: OTP accept → provider after the kill, p99", _ms(r["after_kill_s"], 0.99),
                   "ms", baseline=_ms(r["before_kill_s"], 0.99),
                   baseline_name="p99 before the kill, same run", better="lower",
                   target="≤ 3,000"),
            figure(f"{n}: OTP accept → provider after the kill, max", _ms(r["after_kill_s"], 1.0),
                   "ms", better="lower"),
            figure(f"{n}: plan_transactional resident memory",
                   r["rss_mb"].get("plan_transactional"), "MB", better="lower"),
            figure(f"{n}: Redis memory (every user's copies and the hot state)", r["redis_mb"],
                   "MB", better="lower"),
        ]  # fmt: skip
        notes.append(
            f"{n}: produced in {r['produce_s']} s; the users job's copies at the end "
            f"{r['copies_s']} s later; resident MB {r['rss_mb']}, plan jobs after the OTPs "
            f"{r['rss_after_mb']}; {r['reached']}/{r['sent']} OTPs reached a "
            f"provider; kill → new process {r['kill_to_restart_s']} s (the supervisor looks "
            "every 0.1 s)"
        )
    kills = next((r["dispatch_kills"] for r in raw["runs"] if r.get("dispatch_kills")), None)
    if kills:
        figures += [
            figure("dispatch_transactional killed twice: OTPs sent twice", kills["duplicates"],
                   "OTPs", better="lower",
                   target="≤ in flight at the kills: " + ", ".join(
                       str(k["in_flight"]) for k in kills["per_kill"])),
            figure("dispatch_transactional killed twice: OTP accept → provider, max",
                   _ms(kills["latency_s"], 1.0), "ms", better="lower", target="≤ 3,000"),
            figure("dispatch_transactional killed twice: OTP accept → provider, p99",
                   _ms(kills["latency_s"], 0.99), "ms", better="lower"),
        ]  # fmt: skip
        notes.append(
            f"dispatch_transactional kills: per kill {kills['per_kill']} (in flight = posted and "
            f"not yet at a provider at the kill); {kills['reached']}/{kills['sent']} OTPs reached "
            "a provider"
        )
    return make_result(
        "A plan job killed under OTP traffic, by users loaded", figures, notes=notes,
        details=raw,
    )  # fmt: skip


def result(quick: bool = False) -> dict[str, Any]:
    """The runner's entry point (bench/__main__.py)."""
    return result_of(run([2_000] if quick else [100_000, 1_000_000], quick=quick))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.restart",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--users", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--quick", action="store_true", help="2,000 users (a smoke run)")
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args(argv)
    counts = [2_000] if args.quick else args.users
    res = result_of(run(counts, quick=args.quick))
    for fig in res["figures"]:
        print(f"{fig['name']}: {fig['value']} {fig['unit']}")
    for note in res["notes"]:
        print(f"- {note}")
    if args.json:
        args.json.write_text(json.dumps(res, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
