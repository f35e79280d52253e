"""Recovery under load (SPEC §6): SIGKILL every process kind of a running stack, one at a time.

    python -m bench.recovery [--rate 20] [--quick] [--run-dir DIR]

Starts the full stack (`herald up --detach`, its own run directory; `herald down` at the end no
matter what), puts a steady OTP load through the API (one user and phone per OTP) plus a bulk
email request every 2 s, and kills each component in turn with SIGKILL: the API, every Bytewax
job, the dashboards, every provider simulator, and Redis (AOF on). The supervisor (infra/stack.py)
restarts what died; each kill waits until the component is back and healthy, then `dwell`
seconds of steady load pass before the next one.

Measured per kill: seconds until the supervisor started a new process (`restart`), until it
answered its health check (`healthy`), and until an OTP first POSTed after the kill was accepted
by an SMS provider (`resume`: the pipeline works end to end again), plus the worst OTP
POST→provider time of the OTPs sent in that kill's slot. Provider times come from snapshots of
the simulators' accepted ids about once a second, so they carry up to ~1 s of granularity.

At the end the pipeline settles and the ledger (infra/ledger.py) matches every 202-accepted
delivery against ClickHouse delivery events and the providers' accepted ids: losses (must be
0), duplicates (only in the two-phase guard's crash window), deliveries Herald recorded as
provider-accepted whose copy no snapshot saw (accepted by a simulator just before it was killed).
tests/e2e_faults/test_faults.py runs this and asserts on it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._faultload import Accepted, Producer, ProviderPoll, register_users
from infra.ledger import HeraldEvent, LedgerReport, reconcile
from infra.process import port_open
from infra.stackclient import StackClient

REPO = Path(__file__).resolve().parents[1]

# Redis last: while it restarts the API answers 503 and jobs reconnect, which would blur the
# figures of the kills after it. Simulators near the end for the same reason (failover).
KILL_ORDER = (
    "api", "accepted", "digest", "plan_normal", "plan_bulk", "plan_transactional", "schedule",
    "dispatch_normal", "dispatch_bulk_push", "dispatch_bulk_sms", "dispatch_bulk_email",
    "dispatch_bulk_inapp", "dispatch_transactional",
    "retry_normal", "retry_bulk", "retry_transactional", "receipts", "warehouse", "users",
    "dashboards",
    "sim-apns", "sim-fcm", "sim-email", "sim-sms_a", "sim-sms_b", "redis",
)  # fmt: skip
QUICK_ORDER = ("api", "plan_transactional", "dispatch_transactional", "sim-sms_a", "redis")
# Kills that can open the crash window between a provider's acceptance and Herald recording it
# (a dispatch process, a provider dropping the answer, Redis losing its last second of AOF).
DUPLICATE_WINDOW = ("dispatch_", "sim-", "redis")


OTP_USERS = 100
BULK_EVERY, BULK_SIZE = 3.0, 4


@contextlib.contextmanager
def otp_limit_raised() -> Iterator[None]:
    """The stack's API lets one phone receive many OTPs (the load reuses a pool of phones)."""
    old = os.environ.get("HERALD_API_OTP_PER_PHONE")
    os.environ["HERALD_API_OTP_PER_PHONE"] = "[100000, 600]"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("HERALD_API_OTP_PER_PHONE", None)
        else:
            os.environ["HERALD_API_OTP_PER_PHONE"] = old


@dataclass
class Kill:
    """One SIGKILL and how the stack came back (seconds after the kill)."""

    component: str
    at: float
    restart_s: float | None = None
    healthy_s: float | None = None
    resume_s: float | None = None
    worst_otp_s: float | None = None

    @property
    def opens_duplicate_window(self) -> bool:
        return self.component.startswith(DUPLICATE_WINDOW)


@dataclass
class FaultResult:
    kills: list[Kill]
    accepted: list[Accepted]
    refused: list[tuple[str, str]]
    report: LedgerReport
    baseline_otp_s: float | None
    settle_s: float
    runtime_s: float
    restarts: dict[str, int] = field(default_factory=dict)

    @property
    def otp(self) -> LedgerReport:
        return self.report.by_class("transactional")

    @property
    def bulk(self) -> LedgerReport:
        return self.report.by_class("bulk")

    def render(self) -> str:
        f = _fmt
        lines = [
            f"recovery under load: {len(self.kills)} SIGKILLs, runtime {self.runtime_s:.0f} s, "
            f"settled {self.settle_s:.0f} s after the load stopped",
            f"OTP POST→provider without faults (p50, same run): {f(self.baseline_otp_s)} s",
            f"{'component':<24}{'restart':>9}{'healthy':>9}{'resume':>9}{'worst OTP':>11}",
        ]
        for k in self.kills:
            lines.append(
                f"{k.component:<24}{f(k.restart_s):>9}{f(k.healthy_s):>9}"
                f"{f(k.resume_s):>9}{f(k.worst_otp_s):>11}"
            )
        otp = sum(a.kind == "otp" for a in self.accepted)
        retried = sum(a.attempts > 1 for a in self.accepted)
        lines.append(
            f"accepted: {otp} OTP + {len(self.accepted) - otp} bulk requests "
            f"({retried} needed a retry with the same request_id); never accepted: "
            f"{len(self.refused)} {self.refused[:3]}"
        )
        lines.append(self.otp.render("transactional (OTP) ledger"))
        lines.append(self.bulk.render("bulk ledger"))
        unconfirmed = self.report.by_class("unconfirmed")
        lines.append(
            f"refused requests (never 202): {len(unconfirmed.outcomes)} deliveries, of which "
            f"{len(unconfirmed.outcomes) - unconfirmed.reached_counts().get('not reached', 0)} "
            "were durable anyway and reached an end"
        )
        lines.append(f"stray provider copies: {len(self.report.strays)}")
        return "\n".join(lines)


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def herald_cli(*args: str, run_dir: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "infra.cli", *args, "--run-dir", str(run_dir)],
        capture_output=True, text=True, timeout=timeout, cwd=REPO,
    )  # fmt: skip


@contextlib.contextmanager
def running_stack(run_dir: Path) -> Iterator[Path]:
    """`herald up --detach` in `run_dir`; `herald down` on the way out, whatever happened."""
    try:
        up = herald_cli("up", "--detach", run_dir=run_dir)
        if up.returncode != 0:
            raise RuntimeError(f"herald up failed:\n{up.stdout}\n{up.stderr}")
        yield run_dir
    finally:
        herald_cli("down", run_dir=run_dir, timeout=180)


def component_healthy(state: dict[str, Any], name: str, metrics_served: bool = False) -> bool:
    """The component's own health check (infra/services.py), with the addresses of `state`.

    A Bytewax job's own check is "the process runs"; one that served /metrics before the kill
    counts as back only once it serves them again (its flow is built and running).
    """
    from infra.services import JOBS, SERVICES, Ctx

    ctx = Ctx(run_dir=Path(state["run_dir"]), host=state["host"], ports=dict(state["ports"]))
    component = {c.name: c for c in SERVICES + JOBS}[name]
    metrics = ctx.ports.get(f"metrics_{name}")
    if metrics_served and metrics is not None and not port_open(ctx.host, metrics):
        return False  # a Bytewax job: "alive" is not enough, it serves /metrics once it runs
    try:
        return bool(component.healthy(ctx))
    except Exception:
        return False


def kill_and_wait(stack: StackClient, poll: ProviderPoll, name: str, timeout: float) -> Kill:
    """SIGKILL `name`'s process group, then wait for the supervisor's restart and health."""
    if name.startswith("sim-"):
        poll.snapshot(name.removeprefix("sim-"))  # what it accepted, right before it forgets
    state = stack.refresh_state()
    metrics = state["ports"].get(f"metrics_{name}")
    served = metrics is not None and port_open(state["host"], metrics)
    start = time.monotonic()
    old = stack.kill(name)
    kill = Kill(name, start)
    with contextlib.suppress(TimeoutError):
        stack.wait_restarted(name, old, timeout=timeout)
        kill.restart_s = time.monotonic() - start
        while time.monotonic() - start < timeout:
            if component_healthy(stack.refresh_state(), name, served):
                kill.healthy_s = time.monotonic() - start
                break
            time.sleep(0.2)
    return kill


def herald_events(stack: StackClient) -> list[HeraldEvent]:
    """Every per-delivery state the warehouse recorded in ClickHouse."""
    rows = (
        stack.clickhouse()
        .query(
            "SELECT DISTINCT notification_id, user_id, channel, state, delivery_id, provider, "
            "provider_msg_id FROM delivery_events WHERE channel != ''"
        )
        .result_rows
    )
    return [HeraldEvent(*row) for row in rows]


def settle(
    stack: StackClient, poll: ProviderPoll, accepted: list[Accepted], timeout: float
) -> tuple[LedgerReport, float]:
    """Reconcile until every expected delivery reached an end (or `timeout`); (report, secs)."""
    start = time.monotonic()
    expected = [e for a in accepted for e in a.expected]
    while True:
        poll.snapshot_all()
        try:
            report = reconcile(expected, herald_events(stack), poll.view.copies())
        except Exception:  # ClickHouse briefly unavailable under load: try again
            time.sleep(3)
            continue
        waiting = sum(
            report.by_class(c).reached_counts().get("not reached", 0)
            for c in ("transactional", "bulk")
        )
        if not waiting or time.monotonic() - start > timeout:
            return report, time.monotonic() - start
        time.sleep(3)


def provider_times(report: LedgerReport) -> dict[str, float]:
    """notification_id → when a snapshot first showed its (first) provider copy."""
    out: dict[str, float] = {}
    for o in report.outcomes:
        seen = [c.first_seen for c in o.copies if c.first_seen is not None]
        if seen:
            nid = o.expected.notification_id
            out[nid] = min(out.get(nid, min(seen)), min(seen))
    return out


def resume_figures(kills: list[Kill], accepted: list[Accepted], seen: dict[str, float]) -> None:
    """Fill each kill's `resume_s` and `worst_otp_s` from OTP send and provider-seen times."""
    otps = sorted(
        ((a.sent_at, seen.get(a.notification_id)) for a in accepted if a.kind == "otp"),
        key=lambda x: x[0],
    )
    for k, nxt in zip(kills, [*kills[1:], None], strict=True):
        end = nxt.at if nxt else float("inf")
        after = [p for s, p in otps if s >= k.at and p is not None]
        if after:
            k.resume_s = min(after) - k.at
        slot = [p - s for s, p in otps if k.at - 1.0 <= s < end and p is not None]
        if slot:
            k.worst_otp_s = max(slot)


def run(
    run_dir: Path,
    *,
    rate: float = 20.0,
    kinds: tuple[str, ...] = KILL_ORDER,
    warmup: float = 10.0,
    dwell: float = 3.0,
    restart_timeout: float = 90.0,
    settle_timeout: float = 150.0,
) -> FaultResult:
    """The whole scenario on a stack of its own in `run_dir`; see the module docstring."""
    began = time.monotonic()
    budget = warmup + len(kinds) * (dwell + 15.0) + 60.0
    n_otp, n_bulk = int(rate * budget), int(budget / BULK_EVERY + 1) * BULK_SIZE
    otp_users, bulk_users = OTP_USERS, n_bulk // 3 + 1  # marketing cap: 3 a day per user
    with contextlib.ExitStack() as on_exit:
        on_exit.enter_context(otp_limit_raised())
        on_exit.enter_context(running_stack(run_dir))
        stack = on_exit.enter_context(StackClient.from_run_dir(run_dir, timeout=15.0))
        watcher = on_exit.enter_context(StackClient.from_run_dir(run_dir))  # the poll thread's
        # no wait: a request right after a contact-point change uses it (the plan jobs read
        # the API's copy of what their changelog has not brought yet; tests/e2e)
        register_users(stack, otp_users, bulk_users)
        poll = ProviderPoll(watcher, watcher.pid)
        producer = Producer(
            stack.api_url, rate, otp_users, bulk_users, bulk_every=BULK_EVERY, bulk_size=BULK_SIZE
        )
        poll.start()
        producer.start(otp_limit=n_otp, bulk_limit=n_bulk)
        try:
            time.sleep(warmup)
            warm_end = time.monotonic()
            kills = []
            for name in kinds:
                kills.append(kill_and_wait(stack, poll, name, restart_timeout))
                time.sleep(dwell)
            time.sleep(dwell)
        finally:
            producer.stop()
        report, settle_s = settle(
            stack, poll, producer.accepted + producer.unconfirmed, settle_timeout
        )
        poll.stop()
        seen = provider_times(report)
        resume_figures(kills, producer.accepted, seen)
        calm = [
            seen[a.notification_id] - a.sent_at
            for a in producer.accepted
            if a.kind == "otp" and a.sent_at < warm_end - 2.0 and a.notification_id in seen
        ]
        components = stack.refresh_state()["components"]
        restarts = {n: int(c.get("restarts", 0)) for n, c in components.items()}
    return FaultResult(
        kills, producer.accepted, producer.refused, report,
        statistics.median(calm) if calm else None, settle_s, time.monotonic() - began, restarts,
    )  # fmt: skip


def result(quick: bool = False) -> dict[str, Any]:
    """The bench runner's structured result (bench/_report.py)."""
    from bench._report import figure
    from bench._report import result as make_result

    with tempfile.TemporaryDirectory(prefix="herald-recovery-") as tmp:
        res = run(Path(tmp) / "run", kinds=QUICK_ORDER if quick else KILL_ORDER)
    print(res.render())
    base, name = res.baseline_otp_s, "OTP POST→provider p50 without faults, same run"
    figs = [
        figure("records lost (transactional)", len(res.otp.losses), "deliveries",
               better="lower", target="0"),
        figure("duplicates sent (transactional)", res.otp.duplicates, "copies", better="lower",
               target=f"≤ {sum(k.opens_duplicate_window for k in res.kills)} (crash windows)"),
        figure("duplicates sent (bulk)", res.bulk.duplicates, "copies", better="lower",
               target="0"),
    ]  # fmt: skip
    for k in res.kills:
        figs.append(figure(f"time to resume after SIGKILL {k.component}", k.resume_s, "s",
                           baseline=base, baseline_name=name, better="lower"))  # fmt: skip
    notes = [res.render()]
    return make_result("recovery: SIGKILL each process kind under OTP + bulk load", figs,
                       notes=notes, details={"kills": [k.__dict__ for k in res.kills]})  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.recovery",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rate", type=float, default=20.0, help="OTP requests per second")
    parser.add_argument("--quick", action="store_true", help=f"kill only {', '.join(QUICK_ORDER)}")
    parser.add_argument("--run-dir", type=Path, help="run directory (default: a temp dir)")
    parser.add_argument("--json", type=Path, help="also write the kills and ledger totals here")
    args = parser.parse_args(argv)
    kinds = QUICK_ORDER if args.quick else KILL_ORDER
    with tempfile.TemporaryDirectory(prefix="herald-recovery-") as tmp:
        res = run(args.run_dir or Path(tmp) / "run", rate=args.rate, kinds=kinds)
    print(res.render())
    if args.json:
        doc = {
            "kills": [k.__dict__ for k in res.kills],
            "losses": len(res.otp.losses),
            "duplicates": res.otp.duplicates,
            "bulk_duplicates": res.bulk.duplicates,
            "runtime_s": res.runtime_s,
        }
        args.json.write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
