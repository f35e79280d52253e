"""SMS-pumping controls for the OTPs the API did not accept (the producer path).

    OtpGuard(client, limits, catalog).refusals(batch)
        -> {(id(request), user_id): (reason, detail)}: the users to dead-letter

The API charges the OTPs it accepts against the per-phone limit and the SMS country allow-list
(herald.config.SmsLimits) before it answers. A request that reaches a request topic another
way (a producer, the outbox relay) meets the same rules here, where every path meets: for each
recipient with a phone, an SMS destination outside the allow-list is `sms_prefix_not_allowed`
and a phone over its limit `otp_rate_limited`, each a dead letter with that reason instead of
a plan (the other recipients are planned). The charge is the API's counter
(`herald.keys.otp_limit`), counted once per notification and phone (a marker key beside it), so
a request planned again after a crash is not charged twice.

A request counts as the API's when its record says so (`source` = "api") and the API's claim
of it exists (`idem:{nid}`, set before the API charges and publishes; its status header comes
only after Kafka's ack, too late to tell): a producer cannot skip the limits by writing "api".
Only OTP types are looked at (`NotificationType.otp`); the others cost one catalog lookup per
request.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis

from herald import keys
from herald.catalog import Catalog
from herald.config import SmsLimits
from herald.errors import CatalogLookupError
from herald.planning import API_SOURCE, Planned, PlanRequest

__all__ = ["OtpGuard"]

# KEYS[1] the phone's counter, KEYS[2] this notification's charge of it; ARGV: limit, window.
# 1 = within the limit (counted now or before), 0 = over it.
_CHARGE = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 1 end
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
if n >= tonumber(ARGV[1]) then return 0 end
if redis.call('INCR', KEYS[1]) == 1 then redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2])) end
redis.call('SET', KEYS[2], '1', 'EX', tonumber(ARGV[2]))
return 1
"""
_PREFIX = ("sms_prefix_not_allowed", "SMS to this country/prefix is not allowed")
_KNOWN = 10_000  # notification ids whose origin is remembered


class OtpGuard:
    """See the module docstring."""

    def __init__(
        self,
        client: redis.Redis | redis.RedisCluster,
        limits: SmsLimits,
        catalog: Catalog,
        pii_key: bytes,
    ) -> None:
        self._client = client
        self._pii_key = pii_key
        self._limits = limits
        self._catalog = catalog
        self._charge = client.register_script(_CHARGE)
        self._from_api: dict[str, bool] = {}
        count, window = limits.otp_per_phone
        self._over = ("otp_rate_limited", f"more than {count} OTPs for this phone in {window} s")

    def refusals(self, batch: Sequence[Planned]) -> dict[tuple[int, str], tuple[str, str]]:
        """The users of `batch` whose OTP must not be planned, with the reason and detail."""
        out: dict[tuple[int, str], tuple[str, str]] = {}
        for planned in batch:
            request = planned.request
            try:
                nt = self._catalog.get(request.notification_type)
            except CatalogLookupError:
                continue  # admission dead-letters unknown types
            if not nt.otp or self._accepted_by_api(request):
                continue
            channels = request.policy.channels or nt.allowed_channels
            for view in planned.users:
                phone = view.contacts.phone
                if not phone:
                    continue
                if "sms" in channels and not self._limits.sms_allowed(phone):
                    out[(id(request), view.user_id)] = _PREFIX
                elif not self._charged(phone, request.notification_id):
                    out[(id(request), view.user_id)] = self._over
        return out

    def _accepted_by_api(self, request: PlanRequest) -> bool:
        if request.source != API_SOURCE:
            return False
        nid = request.notification_id
        known = self._from_api.get(nid)
        if known is None:
            if len(self._from_api) >= _KNOWN:
                self._from_api.clear()
            known = self._from_api[nid] = bool(self._client.exists(keys.idem(nid)))
        return known

    def _charged(self, phone: str, notification_id: str) -> bool:
        counter = keys.otp_limit("phone", phone, self._pii_key)
        count, window = self._limits.otp_per_phone
        marker = keys.otp_charge(counter, notification_id)
        return bool(self._charge(keys=[counter, marker], args=[count, window]))
