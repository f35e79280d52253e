"""The plan stage: notification requests of one traffic class -> deliveries, held deliveries and
events (one job per class; flow.py's docstring has the whole path).

    flow.py            the dataflow: `build_flow(traffic_class=...)`, its steps and outputs
    request_source.py  the input: requests, segments expanded into resumable 1,000-user batches
    audience.py        segment members in ClickHouse, read in keyset pages
    planner.py         the batch steps: admission, then the policy with caps and rendering
    planned_alike.py   users planned alike: one user's records made into a class's
    otp_guard.py       SMS-pumping controls for OTPs the API did not accept

    python -m bytewax.run "dataflows.plan:build_flow(traffic_class='transactional')"
"""

from dataflows.plan.flow import build_flow

__all__ = ["build_flow"]
