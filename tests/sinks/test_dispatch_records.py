"""Dispatch's records: which delivery events it marks superseded (herald/kafka_records.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from herald.config import HeraldSettings, RegistrySettings
from herald.dispatching import event
from herald.kafka_records import SUPERSEDED
from herald.states import State
from herald.status_keys import supersedes
from schemas.registry import make_registry
from sinks.dispatch.records import RecordEncoder
from sinks.dispatch.work import Outputs
from tests.sinks.dispatch_helpers import delivery, now


@pytest.fixture
def encoder(tmp_path: Path) -> RecordEncoder:
    settings = HeraldSettings(registry=RegistrySettings(url=None, path=tmp_path / "registry"))
    return RecordEncoder(settings, make_registry(settings.registry))


def _marks(encoder: RecordEncoder, *events: dict) -> list[bytes | None]:
    records = encoder.encode(Outputs(events=list(events)))
    return [dict(r.headers or []).get(SUPERSEDED) for r in records]


def test_a_sending_produced_with_its_providers_answer_is_marked(encoder: RecordEncoder) -> None:
    d, at = delivery("push"), now()
    sending = event(d, State.SENDING, attempt=1, now=at, provider="apns")
    accepted = event(d, State.PROVIDER_ACCEPTED, attempt=1, now=at, provider="apns")
    other = delivery("push")
    alone = event(other, State.SENDING, attempt=1, now=at, provider="apns")
    assert _marks(encoder, sending, alone, accepted) == [b"push/SENDING", None, None]


def test_nothing_is_marked_where_the_later_state_would_not_be_written(
    encoder: RecordEncoder,
) -> None:
    """A retry after a retry: RETRY_SCHEDULED is not entered from RETRY_SCHEDULED, so
    skipping the SENDING between them would keep the older entry."""
    d, at = delivery("sms"), now()
    sending = event(d, State.SENDING, attempt=2, now=at, provider="sms_a")
    retry = event(d, State.RETRY_SCHEDULED, attempt=2, now=at, provider="sms_a", reason="5xx")
    assert _marks(encoder, sending, retry) == [None, None]
    assert not supersedes("push", "SENDING", "RETRY_SCHEDULED")
    assert not supersedes("push", "SENDING", "SENDING")
    assert supersedes("push", "SENDING", "FAILED_PERMANENT")


def test_events_of_another_generation_supersede_nothing(encoder: RecordEncoder) -> None:
    d, at = delivery("push"), now()
    sending = event(d, State.SENDING, attempt=1, now=at, provider="apns")
    replayed = event({**d, "generation": 1}, State.PROVIDER_ACCEPTED, attempt=1, now=at,
                     provider="apns")  # fmt: skip
    assert _marks(encoder, sending, replayed) == [None, None]


def test_each_event_is_judged_against_the_next_of_its_delivery(encoder: RecordEncoder) -> None:
    """A send that fails over within one batch: the first SENDING is followed by a retry (not
    superseded), the second by the answer (superseded); the last event is never marked."""
    d, at = delivery("sms"), now()
    first = event(d, State.SENDING, attempt=1, now=at, provider="sms_a")
    retry = event(d, State.RETRY_SCHEDULED, attempt=1, now=at, provider="sms_a", reason="5xx")
    second = event(d, State.SENDING, attempt=2, now=at, provider="sms_b")
    accepted = event(d, State.PROVIDER_ACCEPTED, attempt=2, now=at, provider="sms_b")
    assert _marks(encoder, first, retry, second, accepted) == [None, None, b"sms/SENDING", None]
