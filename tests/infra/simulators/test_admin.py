"""Fault injection and the admin API, exercised on the Twilio-shaped simulator (plain HTTP)."""

from __future__ import annotations

import time

import httpx
import pytest

from herald.errors import InfraError
from infra.process import pid_alive
from infra.simulators.launcher import RunningSimulator, start_simulator

_HTTP = httpx.Client()


def create(
    sim: RunningSimulator,
    to: str = "+447700900001",
    timeout: float = 5,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    creds = sim.credentials()
    return _HTTP.post(
        f"{sim.base_url}/2010-04-01/Accounts/{creds['account_sid']}/Messages.json",
        data={"To": to, "From": "+15005550006", "Body": "hello"},
        auth=(creds["account_sid"], creds["auth_token"]),
        headers=headers,
        timeout=timeout,
    )


def test_runtime_config_patch_and_validation(sms_a: RunningSimulator) -> None:
    cfg = sms_a.configure(errors={"503": 0.25}, latency={"kind": "uniform", "max_ms": 2})
    assert cfg["errors"] == {"503": 0.25} and cfg["latency"]["kind"] == "uniform"
    with pytest.raises(ValueError, match="unknown error kinds"):
        sms_a.configure(errors={"NoSuchError": 0.5})
    with pytest.raises(ValueError, match="probability"):
        sms_a.configure(errors={"503": 1.5})
    with pytest.raises(ValueError):
        sms_a.configure(no_such_field=1)


def test_latency_is_applied(sms_a: RunningSimulator) -> None:
    sms_a.configure(latency={"kind": "fixed", "ms": 150})
    started = time.perf_counter()
    assert create(sms_a).status_code == 201
    assert time.perf_counter() - started >= 0.15


def test_rate_limit_answers_429_with_retry_after(sms_a: RunningSimulator) -> None:
    sms_a.configure(rate_limit=2, rate_burst=2, retry_after_s=7)
    codes = [create(sms_a) for _ in range(4)]
    assert [r.status_code for r in codes[:2]] == [201, 201]
    limited = codes[2]
    assert limited.status_code == 429 and limited.json()["code"] == 20429
    assert int(limited.headers["retry-after"]) >= 1
    stats = sms_a.stats()
    assert stats["rate_limited"] >= 2 and stats["errors"]["20429"] >= 2


def test_error_mix_probabilities(sms_a: RunningSimulator) -> None:
    sms_a.configure(errors={"503": 0.5}, seed=7)
    statuses = [create(sms_a).status_code for _ in range(60)]
    assert set(statuses) == {201, 503}
    assert 15 <= statuses.count(503) <= 45


def test_timeout_after_accept_records_then_never_answers(sms_a: RunningSimulator) -> None:
    sms_a.configure(timeout_after_accept=1.0, receipts={"enabled": False})
    with pytest.raises(httpx.ReadTimeout):
        create(sms_a, to="+447700900042", timeout=0.5)
    stats = sms_a.stats()
    assert stats["accepted"] == 1 and stats["hung"] == 1
    assert len(stats["accepted_ids"]["+447700900042"]) == 1


def test_accepted_ids_count_duplicates_per_address(sms_a: RunningSimulator) -> None:
    assert sms_a.stats()["last_accepted_at"] is None  # nothing accepted yet
    before = time.time()
    for _ in range(3):
        create(sms_a, to="+447700900077")
    create(sms_a, to="+447700900078")
    assert before <= sms_a.stats()["last_accepted_at"] <= time.time()  # the provider's clock
    create(sms_a, to="+447700900079", headers={"I-Twilio-Idempotency-Token": "d-79"})
    ids = sms_a.stats()["accepted_ids"]
    assert len(ids["+447700900077"]) == 3 and len(ids["+447700900078"]) == 1
    # the reference each copy was sent under (the ledger's echo of Herald's delivery_id)
    assert ids["+447700900079"][0][1] == "d-79" and ids["+447700900078"][0][1] is None
    assert "accepted_ids" not in sms_a.stats(ids=False)
    sms_a.reset()
    assert sms_a.stats()["accepted"] == 0


def test_request_log_times_every_outcome_per_address(sms_a: RunningSimulator) -> None:
    """`?log=1`: [unix time, address, outcome] per request, for end-to-end timing checks."""
    import time

    before = time.time()
    create(sms_a, to="+447700900081")
    sms_a.configure(errors={"503": 1.0})
    assert create(sms_a, to="+447700900082").status_code == 503
    log = sms_a._client().get("/_admin/stats", params={"log": "1"}).json()["log"]
    assert [(a, o) for _, a, o in log] == [("+447700900081", "accepted"), ("+447700900082", "503")]
    assert all(before <= t <= time.time() for t, _, _ in log)
    assert "log" not in sms_a.stats()


def test_reset_restores_start_config(sms_a: RunningSimulator) -> None:
    sms_a.configure(errors={"500": 1.0})
    sms_a.reset(config=True)
    assert create(sms_a).status_code == 201


def test_start_failure_and_stop_leave_no_process(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InfraError):
        start_simulator("sms_a", tmp_path / "bad", config={"errors": {"bogus": 1}}, timeout=5)
    sim = start_simulator("sms_b", tmp_path / "ok")
    pid = sim.process.pid
    assert pid is not None and pid_alive(pid)
    sim.stop()
    assert not pid_alive(pid)
