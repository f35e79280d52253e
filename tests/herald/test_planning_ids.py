"""herald.planning_ids gives exactly herald.ids' delivery and event ids."""

from __future__ import annotations

from herald import ids
from herald.planning_ids import PlanIds


def test_plan_ids_equal_herald_ids() -> None:
    made = PlanIds(max_entries=2)  # small: the prefix memo is also cleared and rebuilt
    for nid in ("n-1", "n-2", "ünï-3", "n-1"):
        for user in ("u1", "ü{2}", ""):
            for channel, device in (("email", None), ("push", "d-9"), ("push", "")):
                did = made.delivery(nid, user, channel, device)
                assert did == ids.delivery_id(nid, user, channel, device)
                for state in ("PLANNED", "SUPPRESSED", "SCHEDULED"):
                    assert made.event(did, state) == ids.event_id(did, state, 0)
    assert made.event("not-a-uuid", "PLANNED") == ids.event_id("not-a-uuid", "PLANNED", 0)
