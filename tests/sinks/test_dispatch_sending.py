"""The sends of a chunk (sinks/dispatch/sending.py): a pool of `in_flight` workers, outcomes in
the deliveries' order, a client that raises answered `Unknown("client_error")`."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from herald.dispatching import retry_policy
from herald.outcomes import Accepted, Outcome, Unknown
from herald.shaping import Grant
from sinks.dispatch.clients import Providers
from sinks.dispatch.loop import LoopThread
from sinks.dispatch.sending import ShapedSender, _Pool
from sinks.dispatch.settings import DispatchSettings
from sinks.dispatch.work import Item
from tests.sinks.dispatch_helpers import delivery, now


class _Counting:
    """A provider that answers the earlier deliveries last (address `t<i>` waits 10 - i ms)
    and records how many calls overlapped."""

    provider = "fake"

    def __init__(self, in_flight: int) -> None:
        self.in_flight = in_flight
        self.now = 0
        self.most = 0

    async def send(self, d: Mapping[str, Any]) -> Outcome:
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            if d["address"] == "broken":
                await asyncio.sleep(0.001)
                raise RuntimeError("a bug in the client")
            await asyncio.sleep((10 - int(d["address"][1:])) / 1000)
            return Accepted(f"m-{d['delivery_id']}", provider=self.provider)
        finally:
            self.now -= 1

    async def aclose(self) -> None:
        return None


@pytest.fixture
def loop() -> Iterator[LoopThread]:
    thread = LoopThread("test-sending")
    yield thread
    thread.close()


def _item(d: dict[str, Any]) -> Item:
    cfg = DispatchSettings()
    policy = retry_policy(cfg.backoff_for("bulk"), failover_on_unknown=False, platform_pause_s=1)
    return Item(d, None, "fake", policy, False, 1)


def test_a_chunk_is_sent_by_in_flight_workers_and_answered_in_order(loop: LoopThread) -> None:
    client = _Counting(in_flight=3)
    providers = Providers(loop, {"fake": lambda: client})
    sender = ShapedSender(providers, None, frozenset(), max_wait_s=1.0, clock=now)  # type: ignore[arg-type]
    items = [_item(delivery("push", address=f"t{i}", traffic_class="bulk")) for i in range(10)]
    items[4].delivery["address"] = "broken"
    events: list[dict[str, Any]] = []
    settled: list[tuple[str, Outcome]] = []
    deferred = sender.send(items, events, lambda it, o: settled.append((it.delivery_id, o)))
    assert deferred == []
    # answered in reverse, settled in the deliveries' order
    assert [d for d, _ in settled] == [it.delivery_id for it in items]
    for it, (_, outcome) in zip(items, settled, strict=True):
        if it.delivery["address"] == "broken":
            assert outcome == Unknown("client_error", provider="fake")  # may have left: no retry
        else:
            assert isinstance(outcome, Accepted)
            assert outcome.provider_msg_id == f"m-{it.delivery_id}"
    assert client.most == 3  # never more calls at once than the client takes
    assert [e["state"] for e in events] == ["SENDING"] * 10


class _Pieces:
    """A shaper that grants `piece` tokens at a time, each 1 ms after the previous one."""

    def __init__(self, piece: int) -> None:
        self.piece = piece
        self.grants = 0

    def acquire(self, provider: str, traffic_class: str, tenant: str, n: int) -> Grant:
        self.grants += 1
        granted = min(n, self.piece)
        return Grant(granted, 0.0 if granted == n else 0.001, 0.0)


def test_chunks_in_flight_together_share_the_providers_workers(loop: LoopThread) -> None:
    client = _Counting(in_flight=4)
    providers = Providers(loop, {"fake": lambda: client})
    shaper = _Pieces(piece=3)
    sender = ShapedSender(providers, shaper, frozenset({"fake"}), max_wait_s=5.0, clock=now)  # type: ignore[arg-type]
    items = [_item(delivery("push", address=f"t{i % 10}", traffic_class="bulk")) for i in range(30)]
    events: list[dict[str, Any]] = []
    settled: list[tuple[str, Outcome]] = []
    deferred = sender.send(items, events, lambda it, o: settled.append((it.delivery_id, o)))
    assert deferred == []
    assert shaper.grants == 10  # ten chunks of three, handed over while earlier ones were sent
    assert [d for d, _ in settled] == [it.delivery_id for it in items]
    assert all(isinstance(o, Accepted) for _, o in settled)
    assert client.most == 4  # the chunks' sends together never more than the client takes


def test_a_chunk_handed_over_as_the_last_worker_leaves_is_still_sent(loop: LoopThread) -> None:
    """The worker that answers a chunk's last delivery leaves in that step (its task's
    callbacks run a loop turn later): the next chunk, handed over before then, starts one."""
    client = _Counting(in_flight=1)
    pool = _Pool("fake", client.send, client.in_flight)
    chunks = [[delivery("push", address="t9", traffic_class="bulk")] for _ in range(3)]

    async def one_after_another() -> list[list[Outcome]]:
        return [await pool.send(chunk) for chunk in chunks]

    answers = loop.run(asyncio.wait_for(one_after_another(), 5.0), timeout=10.0)
    assert [len(a) for a in answers] == [1, 1, 1]
    assert all(isinstance(a[0], Accepted) for a in answers)
