"""The delivery ledger: Herald's view against the providers' view, without any service."""

from __future__ import annotations

from infra.ledger import (
    ExpectedDelivery,
    HeraldEvent,
    ProviderCopy,
    ProviderView,
    reconcile,
)


def otp(n: int, traffic_class: str = "transactional") -> ExpectedDelivery:
    return ExpectedDelivery(f"n{n}", f"u{n}", "sms", f"+1415555{n:04d}", traffic_class)


def ev(n: int, state: str, msg_id: str | None = None) -> HeraldEvent:
    return HeraldEvent(f"n{n}", f"u{n}", "sms", state, f"d{n}", "sms_a", msg_id)


def copy(n: int, msg_id: str, provider: str = "sms_a", ref: str | None = None) -> ProviderCopy:
    return ProviderCopy(provider, f"+1415555{n:04d}", msg_id, ref)


def test_delivered_once_is_neither_lost_nor_duplicated() -> None:
    report = reconcile(
        [otp(1)],
        [ev(1, "PLANNED"), ev(1, "SENDING"), ev(1, "PROVIDER_ACCEPTED", "SM1"), ev(1, "DELIVERED")],
        [copy(1, "SM1")],
    )
    assert report.reached_counts() == {"PROVIDER_ACCEPTED": 1}
    assert report.losses == [] and report.duplicates == 0 and report.unseen == []


def test_a_delivery_stuck_before_the_provider_with_no_copy_is_a_loss() -> None:
    report = reconcile([otp(1), otp(2)], [ev(1, "PLANNED"), ev(1, "SENDING")], [])
    assert [o.expected.user_id for o in report.losses] == ["u1", "u2"]
    assert report.losses[1].last_state == "no events"
    assert "LOST n1 u1 sms: PLANNED,SENDING" in report.render()


def test_terminal_states_are_ends_not_losses() -> None:
    events = [ev(1, "SUPPRESSED"), ev(2, "EXPIRED"), ev(3, "FAILED_PERMANENT"), ev(4, "UNKNOWN")]
    report = reconcile([otp(1), otp(2), otp(3), otp(4)], events, [])
    assert report.reached_counts() == {
        "SUPPRESSED": 1,
        "EXPIRED": 1,
        "FAILED_PERMANENT": 1,
        "UNKNOWN": 1,
    }
    assert report.losses == []


def test_second_copy_at_either_sms_provider_is_a_duplicate() -> None:
    """Sent at sms_a, not recorded, failed over and sent again at sms_b: the user got two."""
    report = reconcile(
        [otp(1), otp(2)],
        [ev(1, "PROVIDER_ACCEPTED", "V2"), ev(2, "PROVIDER_ACCEPTED", "SM3")],
        [copy(1, "SM1"), copy(1, "V2", provider="sms_b"), copy(2, "SM3")],
    )
    assert report.duplicates == 1
    [dup] = report.duplicated
    assert dup.expected.user_id == "u1" and dup.recorded_msg_ids == {"V2"}
    assert "DUP  n1 u1 sms x2" in report.render()


def test_copies_at_unexpected_addresses_are_strays_and_push_counts_per_provider() -> None:
    push = ExpectedDelivery("n9", "u9", "push", "tok9", "bulk")
    report = reconcile(
        [push],
        [HeraldEvent("n9", "u9", "push", "PROVIDER_ACCEPTED", "d9", "fcm", "m1")],
        [ProviderCopy("fcm", "tok9", "m1"), ProviderCopy("apns", "tok-other", "a1")],
    )
    assert report.duplicates == 0 and [s.address for s in report.strays] == ["tok-other"]
    assert report.by_class("bulk").reached_counts() == {"PROVIDER_ACCEPTED": 1}
    assert report.by_class("transactional").outcomes == []


def test_provider_accepted_without_any_copy_is_reported_unseen_and_copy_without_end_stuck() -> None:
    report = reconcile(
        [otp(1), otp(2)], [ev(1, "PROVIDER_ACCEPTED", "SM1"), ev(2, "SENDING")], [copy(2, "SM2")]
    )
    assert [o.expected.user_id for o in report.unseen] == ["u1"]
    assert [o.expected.user_id for o in report.stuck_with_copy] == ["u2"]
    assert report.losses == []


def test_request_level_events_are_ignored() -> None:
    request_level = HeraldEvent("n1", "u1", "", "PROVIDER_ACCEPTED")
    assert reconcile([otp(1)], [request_level], []).losses[0].states == frozenset()


def test_provider_view_keeps_every_incarnation_of_a_restarted_simulator() -> None:
    view = ProviderView()
    view.observe("sms_a", 100, {"accepted_ids": {"+1": [["SM1", None]]}}, at=1.0)
    view.observe("sms_a", 100, {"accepted_ids": {"+1": [["SM1", None]], "+2": [["SM2", None]]}})
    # killed and restarted: the new process starts from zero
    view.observe("sms_a", 200, {"accepted_ids": {"+1": [["SM9", "d1"]]}}, at=5.0)
    view.observe("sms_b", 300, {"accepted": 0})
    copies = sorted(view.copies(), key=lambda c: c.msg_id)
    assert [(c.address, c.msg_id, c.incarnation) for c in copies] == [
        ("+1", "SM1", 100),
        ("+2", "SM2", 100),
        ("+1", "SM9", 200),
    ]
    assert copies[0].first_seen == 1.0 and copies[1].first_seen is None
    assert copies[2].ref == "d1" and copies[2].first_seen == 5.0
    assert view.incarnations("sms_a") == 2 and view.incarnations("sms_b") == 1


def test_deliveries_sharing_an_address_get_their_recorded_copies_and_extras_are_duplicates() -> (
    None
):
    """One phone, three OTPs: ids recorded by Herald decide who owns which copy."""
    phone = "+14155550001"
    exp = [ExpectedDelivery(f"n{i}", "u1", "sms", phone) for i in range(3)]
    events = [
        HeraldEvent("n0", "u1", "sms", "PROVIDER_ACCEPTED", "d0", "sms_a", "SM0"),
        HeraldEvent("n1", "u1", "sms", "PROVIDER_ACCEPTED", "d1", "sms_a", "SM1"),
        HeraldEvent("n2", "u1", "sms", "SENDING", "d2"),  # crashed before recording the result
    ]
    found = [ProviderCopy("sms_a", phone, m) for m in ("SM0", "SMx", "SM1")]
    report = reconcile(exp, events, found)
    assert [[c.msg_id for c in o.copies] for o in report.outcomes] == [["SM0"], ["SM1"], ["SMx"]]
    assert report.duplicates == 0 and [
        o.expected.notification_id for o in report.stuck_with_copy
    ] == ["n2"]
    # the same crash, then a resend Herald recorded: the unrecorded copy is one too many
    events[2] = HeraldEvent("n2", "u1", "sms", "PROVIDER_ACCEPTED", "d2", "sms_b", "V2")
    found.append(ProviderCopy("sms_b", phone, "V2"))
    report = reconcile(exp, events, found)
    assert report.duplicates == 1 and report.losses == []


def test_an_unrecorded_copy_goes_to_the_delivery_the_provider_echoed_not_the_first() -> None:
    """One phone, three OTPs; the third was resent after a crash (a copy it never recorded):
    the provider's echoed delivery_id makes the third the duplicated one, not the first."""
    phone = "+14155550001"
    exp = [ExpectedDelivery(f"n{i}", "u1", "sms", phone) for i in range(3)]
    events = [
        HeraldEvent(f"n{i}", "u1", "sms", "PROVIDER_ACCEPTED", f"d{i}", "sms_a", f"SM{i}")
        for i in range(3)
    ]
    found = [ProviderCopy("sms_a", phone, f"SM{i}", f"d{i}") for i in range(3)]
    found.insert(2, ProviderCopy("sms_a", phone, "SMx", "d2"))
    report = reconcile(exp, events, found)
    assert [[c.msg_id for c in o.copies] for o in report.outcomes] == [
        ["SM0"], ["SM1"], ["SMx", "SM2"]
    ]  # fmt: skip
    assert [o.expected.notification_id for o in report.duplicated] == ["n2"]
    # without the echo (a provider that returns none) the old rule still counts one too many
    found[2] = ProviderCopy("sms_a", phone, "SMx")
    report = reconcile(exp, events, found)
    assert report.duplicates == 1 and [o.expected.notification_id for o in report.duplicated] == [
        "n0"
    ]


def test_vonage_numbers_without_plus_match_the_e164_address() -> None:
    report = reconcile(
        [otp(1)], [ev(1, "PROVIDER_ACCEPTED", "V1")], [ProviderCopy("sms_b", "14155550001", "V1")]
    )
    assert report.unseen == [] and report.strays == [] and len(report.outcomes[0].copies) == 1
