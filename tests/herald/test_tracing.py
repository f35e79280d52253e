"""herald.tracing: the W3C traceparent a notification carries through every job."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dataflows.accepted import accepted_event
from dataflows.schedule import expired_event
from herald import tracing
from herald.delivery_fold import Context
from herald.dispatching import event
from herald.plan_records import event_record
from herald.planning import PlanRequest
from herald.policy import PolicyRequest
from herald.scheduling import ScheduledEntry
from herald.states import State
from tests.schemas.examples import example

TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    "value",
    [
        TRACE,
        TRACE.encode(),
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-later-fields",  # a later version
    ],
)
def test_valid_traceparents_are_kept_as_given(value: str | bytes) -> None:
    expected = value.decode() if isinstance(value, bytes) else value
    assert tracing.traceparent(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "00-not-a-trace",
        TRACE.upper(),  # uppercase hex is invalid
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # zero parent id
        TRACE + "-extra",  # version 00 has four fields
        TRACE + "\n",  # a header value with a line break
        b"\xff\xfe",
        "0" * 600,
    ],
)
def test_invalid_traceparents_are_dropped(value: str | bytes | None) -> None:
    assert tracing.traceparent(value) is None


def test_a_requests_field_wins_over_its_kafka_header() -> None:
    other = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    headers = [("x-other", b"1"), ("TraceParent", other.encode())]
    assert tracing.of_request({"traceparent": TRACE}, headers) == TRACE
    assert tracing.of_request({"traceparent": None}, headers) == other
    assert tracing.of_request({"traceparent": "bad"}, [("traceparent", b"bad")]) is None
    assert tracing.of_request({}, None) is None


def test_every_job_puts_the_trace_on_the_events_it_makes() -> None:
    """accepted (from the request), dispatch (from the delivery), schedule (an expired held
    delivery), receipts (from the delivery's earlier events)."""
    request = example("notification_request")
    assert accepted_event(request, NOW)["traceparent"] == request["traceparent"]
    delivery = example("delivery")
    sent = event(delivery, State.SENDING, attempt=1, now=NOW)
    assert sent["traceparent"] == delivery["traceparent"]
    assert (
        event({**delivery, "traceparent": None}, State.SENDING, attempt=1, now=NOW)["traceparent"]
        is None
    )
    entry = ScheduledEntry(NOW, "d-1", "t", b"", NOW, "n-1", "u-1", "acme", "otp_login", "sms",
                           "transactional", 0, TRACE)  # fmt: skip
    assert expired_event(entry, NOW + timedelta(hours=1))["traceparent"] == TRACE
    ctx = Context.of(example("delivery_event"))
    assert ctx.traceparent == example("delivery_event")["traceparent"]
    untraced = Context.of({**example("delivery_event"), "traceparent": None})
    untraced.learn(example("delivery_event"))  # an earlier event that had it
    assert untraced.traceparent == example("delivery_event")["traceparent"]


def test_a_request_from_a_snapshot_older_than_traces_plans_without_one() -> None:
    """A pending segment expansion restored from a plan job snapshot taken before requests
    carried a traceparent still plans (its records have none)."""
    request = PlanRequest("n-1", "r", "t", "marketing_campaign", "marketing", "bulk", {},
                          PolicyRequest("x"), None, "t:0:1", traceparent=TRACE)  # fmt: skip
    old = object.__new__(PlanRequest)
    old.__setstate__(request.__getstate__()[:-1])  # type: ignore[attr-defined]
    assert event_record(request, "u", "push", "d", State.PLANNED, None, NOW)["traceparent"] == TRACE
    assert event_record(old, "u", "push", "d", State.PLANNED, None, NOW)["traceparent"] is None
