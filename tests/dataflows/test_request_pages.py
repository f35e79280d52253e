"""dataflows/plan/request_source.py: how a segment expansion pages through its audience."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from dataflows.plan.request_source import PAGE_BATCHES, Expansion, RequestSource, _RequestPartition
from herald.planning import AudienceBatch, PlanRequest, PolicyRequest


class _Store:
    """An audience of `n` users in id order; records each page's limit."""

    def __init__(self, n: int) -> None:
        self.users: list[tuple[str, dict[str, str]]] = [(f"u{i:06d}", {}) for i in range(n)]
        self.limits: list[int] = []

    def page(self, segment_id: str, after: str, limit: int) -> list[Any]:
        self.limits.append(limit)
        return [m for m in self.users if m[0] > after][:limit]


class _Controls:
    def planned(self, notification_id: str, users: int, total: int | None = None) -> str:
        return ""


def _partition(store: _Store, pace: Any = None) -> _RequestPartition:
    request = PlanRequest("n-1", "r-1", "t", "marketing_campaign", "marketing", "bulk", {},
                          PolicyRequest("x"), "seg-1", "t:0:1")  # fmt: skip
    source = SimpleNamespace(batch_size=1000, pace=pace, audience=lambda: store,
                             controls=_Controls)  # fmt: skip
    return _RequestPartition(cast(RequestSource, source), cast(Any, None), [Expansion(request)])


def test_an_expansions_first_page_is_one_batch_then_pages_of_several() -> None:
    """The first 1,000 users are planned (and sent) while the next page is read."""
    store = _Store(25_500)
    part = _partition(store)
    batches: list[AudienceBatch] = []
    while part._expansions:
        batches.extend(cast(list[AudienceBatch], part._expand()))
    assert store.limits == [1000, 1000 * PAGE_BATCHES, 1000 * PAGE_BATCHES, 1000 * PAGE_BATCHES]
    assert [b.batch_no for b in batches] == list(range(26))
    assert [len(b.users) for b in batches] == [1000] * 25 + [500]
    assert [b.last for b in batches] == [False] * 25 + [True]
    assert [u for b in batches for u in b.users] == store.users


def test_a_resumed_expansion_reads_full_pages() -> None:
    """A snapshot's expansion past its first batch goes on with pages of several batches."""
    store = _Store(12_000)
    part = _partition(store)
    part._expand()
    resumed = _partition(store)
    resumed._expansions = list(part._expansions)
    resumed._expand()
    assert store.limits == [1000, 1000 * PAGE_BATCHES]
