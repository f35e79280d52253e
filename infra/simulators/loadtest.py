"""Throughput check: push sends/s through `ApnsClient` against one APNs simulator process.

    python -m infra.simulators.loadtest [--n 20000] [--concurrency 512] [--connections 1]
                                        [--processes 1] [--state-dir DIR]

Starts one simulator (HTTP/2 + TLS, JWT checks on, ids not recorded), then `--processes` client
processes each send `n / processes` deliveries with `--concurrency` in flight over
`--connections` HTTP/2 connections. Prints sends/s, outcome counts and the CPU seconds used by
the simulator and by the clients (per-request cost, so the figures compare across busy
machines). Not a test, not a benchmark report: the bench harness owns those.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import resource
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from infra.simulators.launcher import RunningSimulator, start_simulator


def _cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0  # clock ticks at USER_HZ = 100


async def _drive(cfg: dict[str, Any], n: int, concurrency: int) -> Counter[str]:
    from sinks.providers import ApnsClient, ApnsConfig

    client = ApnsClient(ApnsConfig(**cfg, max_concurrency=concurrency))
    counts: Counter[str] = Counter()
    queue = iter(range(n))

    async def worker() -> None:
        for i in queue:
            record = {
                "delivery_id": str(uuid.uuid4()),
                "address": f"{i:064x}",
                "rendered": {"title": "Hi", "body": "load", "data": {}},
            }
            counts[(await client.send(record)).kind] += 1

    async with client:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return counts


def _client_proc(cfg: dict[str, Any], n: int, concurrency: int, out: Any) -> None:
    counts = asyncio.run(_drive(cfg, n, concurrency))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out.put((dict(counts), usage.ru_utime + usage.ru_stime))


def run(sim: RunningSimulator, n: int, concurrency: int, connections: int, procs: int) -> None:
    creds = sim.credentials()
    cfg = {
        "base_url": sim.base_url,
        "ca_path": str(sim.ca_path),
        "team_id": creds["team_id"],
        "key_id": creds["key_id"],
        "auth_key_path": creds["auth_key_path"],
        "topic": "com.herald.load",
        "max_connections": connections,
    }
    asyncio.run(_drive(cfg, 200, 50))  # warm up: TLS, token cache
    pid = sim.process.pid
    assert pid is not None
    sim_cpu = _cpu_seconds(pid)
    ctx = mp.get_context("spawn")
    out: Any = ctx.Queue()
    workers = [
        ctx.Process(target=_client_proc, args=(cfg, n // procs, concurrency, out))
        for _ in range(procs)
    ]
    started = time.perf_counter()
    for w in workers:
        w.start()
    results = [out.get() for _ in workers]
    elapsed = time.perf_counter() - started
    for w in workers:
        w.join()
    counts: Counter[str] = Counter()
    for c, _ in results:
        counts.update(c)
    client_cpu = sum(cpu for _, cpu in results)
    sim_used = _cpu_seconds(pid) - sim_cpu
    total = sum(counts.values())
    print(f"sends={total} outcomes={dict(counts)} elapsed={elapsed:.2f}s")
    print(
        f"throughput={total / elapsed:,.0f} sends/s  ({procs} client process(es), "
        f"{connections} HTTP/2 connection(s) each, {concurrency} in flight each)"
    )
    print(
        f"simulator cpu={sim_used:.2f}s ({sim_used / total * 1e6:.0f} µs/request → "
        f"~{total / sim_used:,.0f} req/s per core)"
        if sim_used
        else "simulator cpu=0"
    )
    print(
        f"client cpu={client_cpu:.2f}s ({client_cpu / total * 1e6:.0f} µs/send → "
        f"~{total / client_cpu:,.0f} sends/s per core)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=512)
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--state-dir", type=Path)
    args = parser.parse_args()
    state = args.state_dir or Path(tempfile.mkdtemp(prefix="herald-apns-load-"))
    with start_simulator("apns", state, config={"record_ids": False}) as sim:
        run(sim, args.n, args.concurrency, args.connections, args.processes)


if __name__ == "__main__":
    main()
