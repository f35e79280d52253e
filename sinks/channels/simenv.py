"""The environment that points the provider clients at the simulators (embedded stack, tests).

    client_env(name, credentials, callback_base=None) -> {"HERALD_APNS_BASE_URL": ..., ...}

`credentials` is the simulator's `<state-dir>/credentials.json` (written at its start;
`RunningSimulator.credentials()`), so the same clients that talk to the real providers talk to
the simulators. `callback_base` (Herald's API URL) sets the status-callback URLs the SMS clients
send with each message (`<api>/v1/callbacks/sms_a|sms_b`). No secret is ever logged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["client_env"]

SENDER_NUMBER = "+15005550006"


def client_env(
    name: str, credentials: Mapping[str, Any], callback_base: str | None = None
) -> dict[str, str]:
    """HERALD_* variables for simulator `name` (apns, fcm, sms_a, sms_b, email)."""
    c = {k: str(v) for k, v in credentials.items() if v is not None}
    base = c["base_url"]
    if name == "apns":
        return {
            "HERALD_APNS_BASE_URL": base, "HERALD_APNS_CA_PATH": c["ca_path"],
            "HERALD_APNS_TEAM_ID": c["team_id"], "HERALD_APNS_KEY_ID": c["key_id"],
            "HERALD_APNS_AUTH_KEY_PATH": c["auth_key_path"], "HERALD_APNS_TOPIC": c["topic"],
        }  # fmt: skip
    if name == "fcm":
        return {
            "HERALD_FCM_BASE_URL": base, "HERALD_FCM_PROJECT_ID": c["project_id"],
            "HERALD_FCM_TOKEN_URI": c["token_uri"],
            "HERALD_FCM_SERVICE_ACCOUNT_FILE": c["service_account_path"],
        }  # fmt: skip
    if name == "sms_a":
        env = {
            "HERALD_TWILIO_BASE_URL": base, "HERALD_TWILIO_ACCOUNT_SID": c["account_sid"],
            "HERALD_TWILIO_AUTH_TOKEN": c["auth_token"], "HERALD_TWILIO_FROM_NUMBER": SENDER_NUMBER,
        }  # fmt: skip
        if callback_base:
            env["HERALD_TWILIO_STATUS_CALLBACK_URL"] = f"{callback_base}/v1/callbacks/sms_a"
        return env
    if name == "sms_b":
        env = {
            "HERALD_VONAGE_BASE_URL": base, "HERALD_VONAGE_API_KEY": c["api_key"],
            "HERALD_VONAGE_API_SECRET": c["api_secret"],
        }  # fmt: skip
        if "signature_secret" in c:
            env["HERALD_VONAGE_SIGNATURE_SECRET"] = c["signature_secret"]
        if callback_base:
            env["HERALD_VONAGE_CALLBACK_URL"] = f"{callback_base}/v1/callbacks/sms_b"
        return env
    if name == "email":
        env = {"HERALD_SENDGRID_BASE_URL": base, "HERALD_SENDGRID_API_KEY": c["api_key"]}
        if "webhook_public_key" in c:
            env["HERALD_SENDGRID_WEBHOOK_PUBLIC_KEY"] = c["webhook_public_key"]
        return env
    raise ValueError(f"unknown simulator {name!r}")
