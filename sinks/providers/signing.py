"""Helpers the providers' callback signature checks share (sinks/providers/<vendor>/signature.py).

same_text(expected, given)   constant-time equality of two texts, any characters
form_params(body)            an application/x-www-form-urlencoded body as a dict ({} if
                             it is not one)
"""

from __future__ import annotations

import hmac
from urllib.parse import parse_qsl

__all__ = ["form_params", "same_text"]


def same_text(expected: str, given: str) -> bool:
    """Constant-time equality of two texts; any text (`compare_digest` refuses non-ASCII `str`:
    a header of other characters is simply not the signature)."""
    return hmac.compare_digest(expected.encode(), given.encode("utf-8", "surrogatepass"))


def form_params(body: bytes) -> dict[str, str]:
    """The form fields of `body` (the last value of a repeated name); {} for a body that is not
    UTF-8 form data."""
    try:
        return dict(parse_qsl(body.decode("utf-8"), keep_blank_values=True))
    except (UnicodeDecodeError, ValueError):
        return {}
