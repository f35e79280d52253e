"""Masking for logs and API answers: never a full phone number, email address, token or OTP code.

The one home of the masks (the API, the provider clients' logs).
"""

from __future__ import annotations


def mask_phone(e164: str | None) -> str:
    """`+41791234567` -> `+41*******67`."""
    if not e164:
        return "-"
    return e164[:3] + "*" * max(len(e164) - 5, 0) + e164[-2:]


def mask_email(address: str | None) -> str:
    """`alice@example.com` -> `a***@example.com`."""
    if not address or "@" not in address:
        return "-"
    local, _, domain = address.partition("@")
    return f"{local[:1]}***@{domain}"


def mask_address(address: str | None) -> str:
    """Any address (token, phone, email) in a provider client's log line: its last 4 characters."""
    if not address:
        return "-"
    return "…" + address[-4:]


def mask_token(token: str | None) -> str:
    """A device token or secret -> its first 6 characters and length."""
    if not token:
        return "-"
    return f"{token[:6]}…({len(token)})"
