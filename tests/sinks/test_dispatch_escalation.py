"""Escalation at dispatch (sinks/dispatch/escalation.py), real Redis and APNs simulator: the
held push of an account_notice is dropped for the user who read the inbox item first and sent
to the one who did not."""

from __future__ import annotations

import pytest

from herald import ids
from herald.status_keys import StatusUpdate, write_statuses
from infra.simulators.launcher import RunningSimulator
from tests.sinks.dispatch_helpers import accepted_for, delivery, factories, harness, now, states

pytestmark = pytest.mark.integration


def test_the_escalation_goes_only_to_the_user_who_did_not_read(
    apns: RunningSimulator, url: str
) -> None:
    reader = delivery(notification_type="account_notice", category="transactional")
    nid = reader["notification_id"]
    other = delivery(notification_type="account_notice", category="transactional",
                     notification_id=nid)  # fmt: skip
    with harness(url, factories({"apns": apns}, url)) as h:
        write_statuses(h.redis, [
            StatusUpdate(nid, ids.delivery_id(nid, reader["user_id"], "inapp"), "READ", "inapp",
                         reader["user_id"], now()),
            StatusUpdate(nid, ids.delivery_id(nid, other["user_id"], "inapp"), "DELIVERED",
                         "inapp", other["user_id"], now()),
        ])  # fmt: skip
        out = h.run([reader, other])
    assert states(out, reader["delivery_id"]) == [("SUPPRESSED", "read_before_escalation")]
    assert ("PROVIDER_ACCEPTED", None) in states(out, other["delivery_id"])
    assert accepted_for(apns, reader["address"]) == 0
    assert accepted_for(apns, other["address"]) == 1


def test_a_push_of_a_type_without_escalation_is_not_looked_at(
    apns: RunningSimulator, url: str
) -> None:
    plain = delivery()  # payment_result: no escalation
    with harness(url, factories({"apns": apns}, url)) as h:
        write_statuses(h.redis, [StatusUpdate(plain["notification_id"], ids.delivery_id(
            plain["notification_id"], plain["user_id"], "inapp"), "READ", "inapp",
            plain["user_id"], now())])  # fmt: skip
        out = h.run([plain])
    assert ("PROVIDER_ACCEPTED", None) in states(out, plain["delivery_id"])
