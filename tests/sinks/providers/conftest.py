"""Provider simulators as real processes (see tests/simulator_fixtures.py)."""

from tests.simulator_fixtures import (  # noqa: F401 - pytest finds fixtures by name here
    apns,
    apns_proc,
    email,
    email_proc,
    fcm,
    fcm_proc,
    recorder,
    sms_a,
    sms_a_proc,
    sms_b,
    sms_b_proc,
)
