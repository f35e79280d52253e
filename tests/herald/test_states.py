"""Delivery state model: transitions per channel, out-of-order receipts, capabilities, layers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from herald.states import (
    CAPABILITIES,
    TABLES,
    Outcome,
    State,
    Support,
    apply,
    fold,
    is_final,
    layers,
    observation_expired,
    transition,
)

S = State
CHANNELS = ["push", "sms", "email", "inapp"]


def test_seed_out_of_order_and_duplicated_receipts() -> None:
    # delivered -> sent -> delivered, and the same webhook three times.
    assert (
        fold("sms", [S.SENDING, S.DELIVERED, S.PROVIDER_ACCEPTED, S.DELIVERED]).state is S.DELIVERED
    )
    assert fold("sms", [S.SENDING, S.PROVIDER_ACCEPTED] + [S.DELIVERED] * 3).state is S.DELIVERED
    assert transition("sms", S.DELIVERED, S.DELIVERED).outcome is Outcome.DUPLICATE


def test_late_sent_never_downgrades_delivered() -> None:
    assert apply("sms", S.DELIVERED, S.PROVIDER_ACCEPTED) == (S.DELIVERED, False)
    assert transition("sms", S.DELIVERED, "PROVIDER_ACCEPTED").outcome is Outcome.STALE
    assert apply("email", S.CLICKED, S.OPENED) == (S.CLICKED, False)
    assert apply("sms", S.DELIVERED, S.SENDING) == (S.DELIVERED, False)


def test_happy_paths_per_channel() -> None:
    path = [S.PLANNED, S.QUEUED, S.SENDING, S.PROVIDER_ACCEPTED]
    assert fold("push", [*path, S.READ]).state is S.READ
    assert fold("sms", [*path, S.DELIVERED]).state is S.DELIVERED
    assert fold("email", [*path, S.DELIVERED, S.OPENED, S.CLICKED]).state is S.CLICKED
    assert fold("inapp", [*path, S.DELIVERED, S.READ]).state is S.READ


def test_read_only_from_delivered_where_the_channel_reports_delivery() -> None:
    early = transition("inapp", S.PROVIDER_ACCEPTED, S.READ)
    assert early == (S.PROVIDER_ACCEPTED, False, Outcome.PREMATURE)
    assert apply("inapp", S.DELIVERED, S.READ) == (S.READ, True)
    folded = fold("inapp", [S.SENDING, S.PROVIDER_ACCEPTED, S.READ, S.DELIVERED])
    assert folded.state is S.READ and folded.pending == ()
    waiting = fold("email", [S.PROVIDER_ACCEPTED, S.CLICKED])
    assert waiting.state is S.PROVIDER_ACCEPTED and waiting.pending == (S.CLICKED,)


def test_push_has_no_delivered_receipt() -> None:
    assert CAPABILITIES["push"].delivered is Support.NOT_PROVIDED
    assert apply("push", S.PROVIDER_ACCEPTED, S.READ) == (S.READ, True)  # an open proves delivery
    assert transition("push", S.PROVIDER_ACCEPTED, S.DELIVERED).outcome is Outcome.UNMAPPABLE
    assert not observation_expired("push", S.PROVIDER_ACCEPTED, T0, T0 + timedelta(days=30))
    assert S.DELIVERY_UNKNOWN not in TABLES["push"][S.PROVIDER_ACCEPTED]


def test_signals_a_channel_does_not_provide_are_unmappable() -> None:
    assert transition("email", S.DELIVERED, S.READ).outcome is Outcome.UNMAPPABLE
    assert transition("sms", S.DELIVERED, S.READ).outcome is Outcome.UNMAPPABLE
    assert transition("sms", S.DELIVERED, "bounced") == (S.DELIVERED, False, Outcome.UNMAPPABLE)
    assert transition("fax", S.SENDING, S.DELIVERED).outcome is Outcome.UNMAPPABLE
    folded = fold("sms", [S.SENDING, "carrier_magic", S.DELIVERED, S.READ])
    assert folded.state is S.DELIVERED and folded.unmappable == ("carrier_magic", "READ")


def test_final_states_never_change() -> None:
    for channel in CHANNELS:
        for final in (S.SUPPRESSED, S.EXPIRED, S.FAILED_PERMANENT):
            assert is_final(final)
            for event in State:
                assert apply(channel, final, event) == (final, False)
    assert is_final(S.READ) and is_final(S.CLICKED) and not is_final(S.UNKNOWN)


def test_unknown_outcomes_are_resolvable() -> None:
    assert apply("sms", S.SENDING, S.UNKNOWN) == (S.UNKNOWN, True)
    assert apply("sms", S.UNKNOWN, S.PROVIDER_ACCEPTED) == (S.PROVIDER_ACCEPTED, True)
    assert apply("sms", S.UNKNOWN, S.DELIVERED) == (S.DELIVERED, True)
    assert apply("sms", S.UNKNOWN, S.SENDING) == (S.SENDING, True)  # retry the type allows
    assert apply("sms", S.PROVIDER_ACCEPTED, S.DELIVERY_UNKNOWN) == (S.DELIVERY_UNKNOWN, True)
    assert apply("sms", S.DELIVERY_UNKNOWN, S.DELIVERED) == (S.DELIVERED, True)
    assert apply("sms", S.DELIVERY_UNKNOWN, S.PROVIDER_ACCEPTED) == (S.DELIVERY_UNKNOWN, False)


def test_retries_and_replays() -> None:
    assert fold("push", [S.SENDING, S.RETRY_SCHEDULED, S.SENDING, S.PROVIDER_ACCEPTED]).state is (
        S.PROVIDER_ACCEPTED
    )
    assert apply("push", S.RETRY_SCHEDULED, S.SUPPRESSED) == (S.SUPPRESSED, True)  # DLQ re-check
    assert apply("push", S.PROVIDER_ACCEPTED, S.RETRY_SCHEDULED) == (S.PROVIDER_ACCEPTED, False)
    assert apply("push", S.SENDING, S.SUPPRESSED) == (S.SENDING, False)
    assert apply("sms", S.QUEUED, S.EXPIRED) == (S.EXPIRED, True)
    assert apply("sms", S.PROVIDER_ACCEPTED, S.EXPIRED) == (S.PROVIDER_ACCEPTED, False)


T0 = datetime(2026, 5, 1, tzinfo=UTC)


def test_observation_windows() -> None:
    assert not observation_expired("sms", S.PROVIDER_ACCEPTED, T0, T0 + timedelta(hours=71))
    assert observation_expired("sms", S.PROVIDER_ACCEPTED, T0, T0 + timedelta(hours=72))
    assert not observation_expired("sms", S.DELIVERED, T0, T0 + timedelta(days=9))
    assert observation_expired("inapp", S.PROVIDER_ACCEPTED, T0, T0 + timedelta(hours=2))


@pytest.mark.parametrize(
    ("channel", "state", "expected"),
    [
        (
            "push",
            S.PROVIDER_ACCEPTED,
            {"provider_accepted": "yes", "delivered": "unknown", "read": "pending"},
        ),
        ("push", S.READ, {"provider_accepted": "yes", "delivered": "yes", "read": "yes"}),
        (
            "push",
            S.SENDING,
            {"provider_accepted": "pending", "delivered": "pending", "read": "pending"},
        ),
        ("sms", S.DELIVERED, {"provider_accepted": "yes", "delivered": "yes"}),
        ("sms", S.DELIVERY_UNKNOWN, {"provider_accepted": "yes", "delivered": "unknown"}),
        ("sms", S.UNKNOWN, {"provider_accepted": "unknown", "delivered": "unknown"}),
        ("sms", S.SUPPRESSED, {"provider_accepted": "no", "delivered": "no"}),
        (
            "email",
            S.CLICKED,
            {"provider_accepted": "yes", "delivered": "yes", "opened": "yes", "clicked": "yes"},
        ),
        (
            "email",
            S.DELIVERED,
            {
                "provider_accepted": "yes",
                "delivered": "yes",
                "opened": "pending",
                "clicked": "pending",
            },
        ),
        ("inapp", S.DELIVERED, {"provider_accepted": "yes", "delivered": "yes", "read": "pending"}),
    ],
)
def test_layers(channel: str, state: State, expected: dict[str, str]) -> None:
    assert layers(channel, state) == expected


# --- properties --------------------------------------------------------------------------------

RANK = {
    S.ACCEPTED: 0, S.PLANNED: 1, S.SCHEDULED: 2, S.QUEUED: 3, S.SENDING: 4,
    S.RETRY_SCHEDULED: 4, S.UNKNOWN: 4, S.PROVIDER_ACCEPTED: 5, S.DELIVERY_UNKNOWN: 5.5,
    S.DELIVERED: 6, S.OPENED: 7, S.READ: 8, S.CLICKED: 8, S.SUPPRESSED: 9, S.EXPIRED: 9,
    S.FAILED_PERMANENT: 9,
}  # fmt: skip
DELIVERED_OR_LATER = {S.DELIVERED, S.OPENED, S.READ, S.CLICKED}
EVENTS = st.lists(st.sampled_from([*State, "bogus"]), max_size=25)


@given(channel=st.sampled_from(CHANNELS), events=EVENTS)
def test_state_never_regresses(channel: str, events: list[State | str]) -> None:
    state = S.ACCEPTED
    for event in events:
        new, changed = apply(channel, state, event)
        assert changed == (new != state)
        assert RANK[new] >= RANK[state] or (state, new) == (S.UNKNOWN, S.SENDING)
        if state in DELIVERED_OR_LATER:
            assert new in DELIVERED_OR_LATER
        state = new


HAPPY = {
    "push": [S.SENDING, S.PROVIDER_ACCEPTED, S.READ],
    "sms": [S.SENDING, S.PROVIDER_ACCEPTED, S.DELIVERED],
    "email": [S.PROVIDER_ACCEPTED, S.DELIVERED, S.OPENED, S.CLICKED],
    "inapp": [S.SENDING, S.PROVIDER_ACCEPTED, S.DELIVERED, S.READ],
}


@given(data=st.data(), channel=st.sampled_from(CHANNELS))
def test_any_arrival_order_of_receipts_gives_the_same_state(
    data: st.DataObject, channel: str
) -> None:
    events = data.draw(st.permutations(HAPPY[channel]))
    dupes = data.draw(st.lists(st.sampled_from(HAPPY[channel]), max_size=4))
    folded = fold(channel, [*events, *dupes])
    assert folded.state is HAPPY[channel][-1]
    assert folded.pending == ()
