"""`python -m bench.campaign_control [--users N]`: a segment of N users (1M by default) created
through the API, a push campaign to it paused, resumed and cancelled on `herald up` (issue 20).

What it does, as a user would, and what it measures at the FCM simulator's own request log:

1. the users' contact points on the herald.devices changelog (bulk import, as a CRM export
   would be; `FullStack.produce_contact_points`), then the segment streamed to
   `PUT /v1/segments/{id}` as JSON lines (upload time, the API process's memory after it);
2. a marketing push campaign to the segment; once `--step` messages reached FCM, a pause:
   no message after the pause was answered, the plan job's expansion held (users planned
   stop growing), what reached dispatch parked;
3. a resume (parked deliveries released), `--step` more messages, then a cancel: no message
   after the cancel was answered, and once every user is accounted for, sent + not sent =
   deliveries = users (the rest SUPPRESSED `cancelled`).

Figures land in bench/results/campaign_control.txt (`--out DIR` elsewhere).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench._fullstack import FullStack, full_stack

RESULTS = Path(__file__).with_name("results")
ENV = {"HERALD_LOG_LEVEL": "WARNING"}


def _say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _wait(check: Callable[[], Any], what: str, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.5)


def _fcm_times(stack: FullStack, prefix: str) -> list[float]:
    """When FCM accepted each message to a token of this run (the simulator's clock)."""
    log = stack.sim_stats("fcm", log=True)["log"]
    return sorted(float(t) for t, address, outcome in log
                  if outcome == "accepted" and str(address).startswith(prefix))  # fmt: skip


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _lines(users: list[str]) -> Iterator[bytes]:
    chunk: list[bytes] = []
    for user in users:
        chunk.append(orjson.dumps(user) + b"\n")
        if len(chunk) == 10_000:
            yield b"".join(chunk)
            chunk = []
    if chunk:
        yield b"".join(chunk)


def run(users: int, step: int, out: Path) -> dict[str, Any]:
    """The scenario; its figures."""
    run_id = f"cc{os.getpid()}"
    ids = [f"{run_id}-u{i:07d}" for i in range(users)]
    figures: dict[str, Any] = {"users": users, "step": step}
    with tempfile.TemporaryDirectory(prefix="herald-cc-") as tmp, \
            full_stack(Path(tmp) / "run", ENV) as stack:  # fmt: skip
        api = httpx.Client(base_url=stack.api.base_url, headers=dict(stack.api.headers),
                           timeout=900)  # fmt: skip
        started = time.monotonic()
        stack.produce_contact_points(ids)
        figures["contact_points_s"] = round(time.monotonic() - started, 1)
        _say(f"{users:,} users' contact points copied in {figures['contact_points_s']} s")

        segment = f"{run_id}-segment"
        started = time.monotonic()
        resp = api.put(f"/v1/segments/{segment}", content=_lines(ids),
                       headers={"Content-Type": "application/x-ndjson"})  # fmt: skip
        resp.raise_for_status()
        figures["upload_s"] = round(time.monotonic() - started, 1)
        figures["segment"] = resp.json()
        figures["api_rss_mb_after_upload"] = round(
            _rss_mb(stack.state["components"]["api"]["pid"]), 1
        )
        _say(f"segment uploaded in {figures['upload_s']} s: {resp.json()}")

        params = {"headline": "Sale", "offer": "20% off", "cta_url": "https://x.test"}
        body = {
            "request_id": f"{run_id}-campaign", "notification_type": "marketing_campaign",
            "recipients": {"segment_id": segment}, "channels": ["push"], "params": params,
        }  # fmt: skip
        nid, sent_at = stack.post(body)
        prefix = f"tok-{run_id}-"

        def status() -> dict[str, Any]:
            return dict(api.get(f"/v1/notifications/{nid}", params={"limit": 1}).json())

        _wait(lambda: len(_fcm_times(stack, prefix)) >= step, "first sends", 900)
        figures["first_step_s"] = round(time.time() - sent_at, 1)
        asked = time.time()
        paused = api.post(f"/v1/notifications/{nid}/pause").json()
        paused_at = time.time()
        figures["pause"] = {**paused, "answer_ms": round((paused_at - asked) * 1000)}
        planned_at_pause = status()["progress"]["users_planned"]
        _say(f"paused after {figures['first_step_s']} s: {paused}, planned {planned_at_pause:,}")

        def all_parked() -> dict[str, Any] | None:
            s = status()
            parked = s["summary"].get("SCHEDULED", 0)
            return (
                s
                if parked and s["progress"]["sent"] + parked == s["progress"]["deliveries"]
                else None
            )

        held = _wait(all_parked, "paused deliveries parked", 1800)
        sends = _fcm_times(stack, prefix)
        figures["paused"] = {
            "users_planned_at_answer": planned_at_pause,
            "users_planned_after": held["progress"]["users_planned"],
            "parked": held["summary"].get("SCHEDULED", 0),
            "sent": held["progress"]["sent"],
            "sends_after_answer": sum(1 for t in sends if t > paused_at),
        }
        _say(f"held: {figures['paused']}")

        asked = time.time()
        resumed = api.post(f"/v1/notifications/{nid}/resume").json()
        figures["resume"] = {**resumed, "answer_s": round(time.time() - asked, 1)}
        _say(f"resumed: {figures['resume']}")
        _wait(lambda: len(_fcm_times(stack, prefix)) >= len(sends) + step, "sends after resume",
              900)  # fmt: skip
        asked = time.time()
        cancelled = api.post(f"/v1/notifications/{nid}/cancel").json()
        cancelled_at = time.time()
        figures["cancel"] = {**cancelled, "answer_ms": round((cancelled_at - asked) * 1000)}
        _say(f"cancelled: {figures['cancel']}")

        def accounted() -> dict[str, Any] | None:
            s = status()
            p = s["progress"]
            done = p["users_planned"] == users and p["remaining"] == 0
            return s if done and p["deliveries"] >= users else None

        final = _wait(accounted, "every user accounted for", 3600)
        figures["accounted_after_cancel_s"] = round(time.time() - cancelled_at, 1)
        sends = _fcm_times(stack, prefix)
        after = sum(1 for t in sends if t > cancelled_at)
        figures["final"] = {
            **final["progress"], "summary": final["summary"], "fcm_accepted": len(sends),
            "sends_after_cancel_answer": after,
        }  # fmt: skip
        _say(f"final: {figures['final']}")
        api.close()
    text = "\n".join(_table(figures))
    out.mkdir(parents=True, exist_ok=True)
    (out / "campaign_control.txt").write_text(text + "\n")
    return figures


def _table(f: dict[str, Any]) -> list[str]:
    fin, paused = f["final"], f["paused"]
    adds_up = fin["sent"] + fin["not_sent"] == fin["deliveries"] == f["users"]
    return [
        f"== campaign control on `herald up` ({os.cpu_count()} cores), "
        f"{time.strftime('%Y-%m-%d %H:%M')} UTC",
        f"segment of {f['users']:,} users through PUT /v1/segments: {f['upload_s']} s "
        f"(size {f['segment']['size']:,}); API RSS after it {f['api_rss_mb_after_upload']} MB",
        f"contact points imported on the changelog and copied: {f['contact_points_s']} s",
        f"pause after {f['step']:,} messages at FCM ({f['first_step_s']} s after the campaign): "
        f"answered in {f['pause']['answer_ms']} ms, settled {f['pause']['settled']}",
        f"  users planned at the answer {paused['users_planned_at_answer']:,}, once everything "
        f"was parked {paused['users_planned_after']:,}; parked {paused['parked']:,}; "
        f"messages at FCM after the answer: {paused['sends_after_answer']}",
        f"resume: {f['resume']['released']:,} parked deliveries released in "
        f"{f['resume']['answer_s']} s",
        f"cancel after {f['step']:,} more: answered in {f['cancel']['answer_ms']} ms, settled "
        f"{f['cancel']['settled']}; messages at FCM after the answer: "
        f"{fin['sends_after_cancel_answer']}",
        f"every user accounted for {f['accounted_after_cancel_s']} s after the cancel: deliveries "
        f"{fin['deliveries']:,} = sent {fin['sent']:,} + not sent {fin['not_sent']:,} "
        f"({'adds up' if adds_up else 'DOES NOT ADD UP'}); FCM accepted {fin['fcm_accepted']:,}",
        f"summary: {fin['summary']}",
    ]


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.campaign_control`."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.campaign_control", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--users", type=int, default=1_000_000)
    parser.add_argument("--step", type=int, default=20_000, help="messages between controls")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    figures = run(args.users, args.step, args.out)
    print("\n".join(_table(figures)))
    fin = figures["final"]
    ok = (fin["sends_after_cancel_answer"] == 0 and figures["paused"]["sends_after_answer"] == 0
          and fin["sent"] + fin["not_sent"] == fin["deliveries"] == figures["users"])  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
