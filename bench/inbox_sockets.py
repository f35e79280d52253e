"""Live inbox WebSockets on one API process, and the accept latency beside them.

    python -m bench.inbox_sockets [--sockets 10000] [--rate 500] [--duration 15]
                                  [--tier own|shared]

Starts the embedded services (Kafka, Redis, ClickHouse) in a temporary run directory and the
API as its own process (`python -m api`, one worker); with `--tier own` (the default, the
deployment the README describes) a second API process, the socket tier, holds the sockets while
the first takes the accepts; with `--tier shared` one process does both. Then, in one run:

1. accept latency without sockets: open-loop POST /v1/notifications at `--rate` for
   `--duration` s (bench/api_accept.py's client: latency from each request's scheduled instant);
2. `--sockets` inbox WebSockets, each of its own user, opened by a second process (so the
   client's work is not the load generator's), each confirmed by its first frame (the unread
   count, sent once the socket is subscribed);
3. the same accept load with every socket open;
4. fan-out: one inbox item for each of 1,000 of those users (written as the inbox sink does),
   the time until every one reached its socket.

Reported: sockets open, seconds to open them, API RSS before and after, accept p50/p99 in 1
and 3 (the figure that must hold), items delivered to their sockets in 4 and the seconds that
took. A process serves every socket from one Redis subscription (api/inbox_hub.py).

Why a tier of its own: ~180 objects a socket are tracked by Python's cycle collector, and with
10,000 sockets a full collection (0.3-1.1 s) lands in a shared process's accept p99 from time
to time; on a process of its own it only delays a live update.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.api_accept import BENCH_KEY, _start_api, load_api

FANOUT_USERS = 1000
OPEN_CONCURRENCY = 200  # handshakes in flight while the sockets are opened


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _hold(url: str, key: str, sockets: int, prefix: str) -> None:
    """The socket-holding process: open the sockets, say "ready", then, given the number of
    items on stdin, wait for them (at most 60 s) and say how many arrived and when the last
    one did."""
    from websockets.asyncio.client import connect

    ws = url.replace("http://", "ws://") + "/v1/users/{}/inbox/ws"
    gate = asyncio.Semaphore(OPEN_CONCURRENCY)
    received: list[float] = []
    started = time.perf_counter()

    async def one(i: int) -> Any:
        async with gate:
            sock = await connect(ws.format(f"{prefix}{i}"), additional_headers={"X-API-Key": key},
                                 open_timeout=60, ping_interval=None, max_queue=4)  # fmt: skip
            await sock.recv()  # the unread count: subscribed
        return sock

    async def listen(sock: Any) -> None:
        async for _frame in sock:
            received.append(time.perf_counter())

    socks = await asyncio.gather(*(one(i) for i in range(sockets)))
    listeners = [asyncio.create_task(listen(s)) for s in socks]
    print(f"ready {len(socks)} {time.perf_counter() - started:.2f}", flush=True)
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    expected, deadline = int(line or 0), time.monotonic() + 60
    while len(received) < expected and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    print(f"received {len(received)} {received[-1] if received else 0:.6f}", flush=True)
    for task in listeners:
        task.cancel()
    await asyncio.gather(*(s.close() for s in socks), return_exceptions=True)


def _fanout(redis_url: str, users: list[str]) -> float:
    """One inbox item per user, as the inbox sink writes it; the perf_counter of the start."""
    import redis

    from herald.inbox import add_inbox_item, inbox_item

    client = redis.Redis.from_url(redis_url)
    started = time.perf_counter()
    for n, user in enumerate(users):
        add_inbox_item(client, user, inbox_item(f"bench-{n}", "Hi", "there", n + 1), 500)
    client.close()
    return started


def run(sockets: int, rate: float, duration: float, tier: str = "own") -> dict[str, Any]:
    """The scenario on a fresh embedded stack; its figures. `tier` "own": the sockets are held
    by an API process of their own (the socket tier a deployment routes
    `/v1/users/*/inbox/ws` to), the accepts go to another; "shared": one process serves both."""
    from api.auth import hash_key
    from herald.config import KafkaSettings
    from infra.process import free_port
    from infra.stack import Stack
    from infra.topics import create_topics

    run_dir = Path(tempfile.mkdtemp(prefix="herald-bench-sockets-"))
    stack = Stack(run_dir, jobs=[])
    ctx = stack.start()
    api_proc = holder = socket_proc = None
    finished = False
    try:
        env = {**os.environ, **ctx.child_env(), "HERALD_KAFKA_TOPIC_PREFIX": "bench."}
        create_topics(KafkaSettings(bootstrap_servers=env["HERALD_KAFKA_BOOTSTRAP_SERVERS"],
                                    topic_prefix="bench."))  # fmt: skip
        tenants = run_dir / "tenants.toml"
        tenants.write_text(
            f"[tenants.bench]\nrate_limit_per_second = 1000000\n[[tenants.bench.keys]]\n"
            f'id = "bench"\nsha256 = "{hash_key(BENCH_KEY)}"\n'
            'scopes = ["notifications:write", "inbox:read"]\n'
        )
        env["HERALD_API_TENANTS_FILE"] = str(tenants)
        env["HERALD_API_INBOX_WS_PER_TENANT"] = str(max(sockets, 1) * 2)
        port = free_port("127.0.0.1")
        api_proc = _start_api(env, port, run_dir / "api.log", 1)
        url = f"http://127.0.0.1:{port}"
        asyncio.run(load_api(url, BENCH_KEY, rate, 2.0, 32))  # warm-up
        alone = asyncio.run(load_api(url, BENCH_KEY, rate, duration, 32)).summary()
        socket_url, socket_proc = url, api_proc
        if tier == "own":
            socket_port = free_port("127.0.0.1")
            socket_proc = _start_api(env, socket_port, run_dir / "api-sockets.log", 1)
            socket_url = f"http://127.0.0.1:{socket_port}"
        rss_before = _rss_mb(socket_proc.pid)
        prefix = f"sock-{random.randrange(1 << 30):x}-"
        holder = subprocess.Popen(
            [sys.executable, "-m", "bench.inbox_sockets", "hold", "--url", socket_url,
             "--sockets", str(sockets), "--prefix", prefix],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        assert holder.stdin is not None and holder.stdout is not None
        ready = holder.stdout.readline().split()
        if not ready or ready[0] != "ready":
            raise RuntimeError(f"the socket holder failed: {ready}")
        opened, open_s = int(ready[1]), float(ready[2])
        rss_after = _rss_mb(socket_proc.pid)
        beside = asyncio.run(load_api(url, BENCH_KEY, rate, duration, 32)).summary()
        users = [f"{prefix}{i}" for i in random.sample(range(sockets), min(FANOUT_USERS, sockets))]
        fanout_start = _fanout(env["HERALD_REDIS_URL"], users)
        holder.stdin.write(f"{len(users)}\n")
        holder.stdin.close()
        done = holder.stdout.readline().split()
        holder.wait(60)
        delivered, last = int(done[1]), float(done[2])
        finished = True
    finally:
        for proc in (holder, socket_proc, api_proc):
            if proc is not None and proc.poll() is None:
                proc.kill()
        stack.stop()
        if finished:
            shutil.rmtree(run_dir, ignore_errors=True)
        else:
            print(f"inbox_sockets: stack logs kept in {run_dir}", file=sys.stderr)
    return {
        "cores": os.cpu_count(),
        "tier": tier,
        "sockets_requested": sockets,
        "sockets_open": opened,
        "open_s": round(open_s, 1),
        "rss_before_mb": round(rss_before),
        "rss_with_mb": round(rss_after),
        "rss_per_socket_kb": round((rss_after - rss_before) * 1024 / max(opened, 1), 1),
        "offered_per_s": rate,
        "alone": alone,
        "beside": beside,
        "fanout_items": len(users),
        "fanout_delivered": delivered,
        # the holder's clock is this machine's perf_counter (one boot, one clock)
        "fanout_s": round(max(last - fanout_start, 0.0), 2),
    }


def _table(f: dict[str, Any]) -> dict[str, Any]:
    alone, beside = f["alone"], f["beside"]
    where = ("one socket-tier API process (accepts on another)" if f.get("tier") == "own"
             else "the API process that also takes the accepts")  # fmt: skip
    return {
        f"sockets open on {where}": f"{f['sockets_open']:,} of {f['sockets_requested']:,}",
        "seconds to open them": f["open_s"],
        "socket process RSS MB before / with them": f"{f['rss_before_mb']} / {f['rss_with_mb']}"
        f" ({f['rss_per_socket_kb']} KB a socket)",
        f"accept p50 / p99 ms at {f['offered_per_s']:.0f}/s, no sockets":
            f"{alone['p50_ms']} / {alone['p99_ms']}",
        "accept p50 / p99 ms, every socket open": f"{beside['p50_ms']} / {beside['p99_ms']}",
        "accept errors (no sockets / with)": f"{alone['error_rate']} / {beside['error_rate']}",
        "items for distinct users at their sockets": f"{f['fanout_delivered']} of "
        f"{f['fanout_items']}, last after {f['fanout_s']} s",
    }  # fmt: skip


def result(quick: bool = False) -> dict[str, Any]:
    """The scenario for `make bench` (bench/__main__.py)."""
    from bench._report import figure
    from bench._report import result as make_result

    f = run(200 if quick else 10_000, 200 if quick else 500, 4 if quick else 15)
    alone, beside = f["alone"], f["beside"]
    without = "the same load with no socket open"
    figures = [
        figure("inbox WebSockets open on one (socket-tier) API process", f["sockets_open"],
               "sockets", target=">= 10,000"),
        figure("accept latency p99 on the API process, every socket open", beside["p99_ms"],
               "ms",
               baseline=alone["p99_ms"], baseline_name=without, better="lower",
               target="unaffected"),
        figure("accept latency p50, every socket open", beside["p50_ms"], "ms",
               baseline=alone["p50_ms"], baseline_name=without, better="lower"),
        figure("API memory per open socket", f["rss_per_socket_kb"], "KB", better="lower"),
        figure(f"one item each for {f['fanout_items']:,} users: the last at its socket",
               f["fanout_s"], "s",
               better="lower"),
    ]  # fmt: skip
    notes = [f"{k}: {v}" for k, v in _table(f).items()]
    return make_result("Inbox WebSockets on a socket-tier API process", figures, notes=notes,
                       details=f)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.inbox_sockets` (or its `hold` child)."""
    parser = argparse.ArgumentParser(prog="python -m bench.inbox_sockets", description=__doc__)
    parser.add_argument("mode", nargs="?", default="run", choices=["run", "hold"])
    parser.add_argument("--sockets", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=500.0, help="accepts/s offered")
    parser.add_argument("--duration", type=float, default=15.0)
    parser.add_argument("--url", help="hold: the API")
    parser.add_argument("--prefix", default="sock-", help="hold: user id prefix")
    parser.add_argument(
        "--tier", choices=["own", "shared"], default="own",
        help="own: the sockets on an API process of their own (default); shared: one process",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    if args.mode == "hold":
        asyncio.run(_hold(args.url, BENCH_KEY, args.sockets, args.prefix))
        return 0
    figures = run(args.sockets, args.rate, args.duration, args.tier)
    table = _table(figures)
    width = max(len(k) for k in table)
    print(f"\n== inbox WebSockets, {args.tier} socket tier ({figures['cores']} cores)")
    for name, value in table.items():
        print(f"  {name:<{width}} {value}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
