"""What `herald up` gives each job (infra/services.py), without starting anything."""

from __future__ import annotations

from pathlib import Path

from infra.services import BACKGROUND_FETCH_WAIT_MS, FETCH_WAIT_MS, Ctx, jobs


def test_every_bytewax_job_gets_its_fetch_wait_and_the_transactional_path_the_shortest() -> None:
    ctx = Ctx(Path("/nonexistent"), "127.0.0.1", {})
    waits: dict[str, int] = {}
    for component in jobs(1):
        if component.job is None:
            continue
        ports = {p: 1 for p in component.ports}
        env = component.env(Ctx(ctx.run_dir, ctx.host, ports)) if component.env else {}
        waits[component.job] = int(env["HERALD_KAFKA_FETCH_WAIT_MS"])
    assert {job: waits[job] for job in FETCH_WAIT_MS} == FETCH_WAIT_MS
    assert waits["dispatch_bulk_push"] == waits["receipts"] == BACKGROUND_FETCH_WAIT_MS
    fastest = min(waits.values())
    assert {j for j, w in waits.items() if w == fastest} == {
        "plan_transactional",
        "dispatch_transactional",
    }
