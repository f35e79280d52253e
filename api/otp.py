"""OTP abuse controls: per phone / end-user IP / end-user device limits, SMS prefix allow-list,
and the sent-vs-verified counters behind the SMS-pumping signal.

Upstream services forward who asked for the code in headers (the API caller is a backend, so
its own address says nothing about the end user):

    X-End-User-IP       the end user's IP address (limit per IP)
    X-End-User-Device   a stable device identifier (limit per device)

The phone limit uses the phone of each recipient's contact points (Redis copy). Limits are fixed
windows; a request over any limit is refused whole with 429 + Retry-After, and nothing is
counted for it. Keys hold a keyed digest of the phone/device (PII key), never the value.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import orjson
from redis.exceptions import RedisError

from api.problems import ProblemError
from api.state import AppState, redis_unavailable
from herald import keys
from herald.pii import mask_phone

log = logging.getLogger(__name__)

# KEYS: limit keys; ARGV: limit_1, window_1, limit_2, window_2, ...
# All-or-nothing: returns {0} after counting, or {i, ttl_ms} for the first key over its limit.
_OTP_LIMIT_SCRIPT = """
for i, key in ipairs(KEYS) do
  local n = tonumber(redis.call('GET', key) or '0')
  if n >= tonumber(ARGV[2 * i - 1]) then
    return {i, redis.call('PTTL', key)}
  end
end
for i, key in ipairs(KEYS) do
  if redis.call('INCR', key) == 1 then
    redis.call('EXPIRE', key, tonumber(ARGV[2 * i]))
  end
end
return {0, 0}
"""

STATS_TTL_SECONDS = 48 * 3600


def sms_prefix_problem(loc: list[str | int]) -> ProblemError:
    """422 sms_prefix_not_allowed."""
    msg = "SMS to this country/prefix is not allowed"
    return ProblemError(
        422, "sms_prefix_not_allowed", msg,
        errors=[{"loc": loc, "code": "sms_prefix_not_allowed", "msg": msg}],
    )  # fmt: skip


async def recipient_phones(st: AppState, user_ids: list[str]) -> dict[str, str]:
    """user_id -> E.164 phone from the contact points copy (users without a phone left out)."""
    pipe = st.redis.pipeline(transaction=False)
    for user_id in user_ids:
        pipe.get(keys.contact_points(user_id))
    out: dict[str, str] = {}
    for user_id, raw in zip(user_ids, await pipe.execute(), strict=True):
        if raw:
            phone = (orjson.loads(raw).get("phone") or {}).get("e164")
            if phone:
                out[user_id] = phone
    return out


async def check_otp_recipients(st: AppState, user_ids: list[str], sms: bool) -> set[str]:
    """The recipients' phone numbers, after the prefix allow-list (when SMS may be used)."""
    try:
        phones = await recipient_phones(st, user_ids)
    except RedisError as exc:
        raise redis_unavailable(st, exc) from exc
    if sms:
        for user_id, phone in phones.items():
            if not st.api.sms_allowed(phone):
                st.metrics.rejected.labels("sms_prefix_not_allowed").inc()
                log.info("api.otp_prefix_refused phone=%s", mask_phone(phone))
                raise sms_prefix_problem(
                    ["body", "recipients", "user_ids", user_ids.index(user_id)]
                )
    return set(phones.values())


async def charge_otp_limits(
    st: AppState, phones: set[str], ip: str | None, device: str | None
) -> None:
    """Count one OTP against the per phone/IP/device limits; 429 when one is used up. Charged
    once per new request (after the idempotency check: a retried request_id is free)."""
    key = st.settings.pii.key_bytes()
    limits: list[tuple[str, str, tuple[int, int]]] = [
        ("phone", keys.otp_limit("phone", p, key), st.api.otp_per_phone) for p in sorted(phones)
    ]
    if ip:
        limits.append(("ip", keys.otp_limit("ip", ip, key), st.api.otp_per_ip))
    if device:
        limits.append(("device", keys.otp_limit("device", device, key), st.api.otp_per_device))
    if not limits:
        return
    argv: list[int] = []
    for _, _, (count, window) in limits:
        argv += [count, window]
    try:
        hit, ttl_ms = await st.script(_OTP_LIMIT_SCRIPT, [k for _, k, _ in limits], argv)
    except RedisError as exc:
        raise redis_unavailable(st, exc) from exc
    if int(hit):
        dimension = limits[int(hit) - 1][0]
        retry = max(1, (int(ttl_ms) + 999) // 1000)
        st.metrics.otp_limited.labels(dimension).inc()
        raise ProblemError(
            429, "otp_rate_limited", f"too many OTPs for this {dimension}; retry later",
            headers={"Retry-After": str(retry)}, retry_after=retry, dimension=dimension,
        )  # fmt: skip


def _hour(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y%m%d%H")


async def count_otp(st: AppState, notification_type: str, what: str, at: datetime) -> None:
    """Add one to the shared hourly `sent`/`verified` counter (best effort)."""
    key = keys.otp_stats(_hour(at))
    try:
        pipe = st.redis.pipeline(transaction=False)
        pipe.hincrby(key, f"{notification_type}:{what}", 1)
        pipe.expire(key, STATS_TTL_SECONDS)
        await pipe.execute()
    except RedisError:
        log.warning("api.otp_stats_failed what=%s", what)


async def refresh_otp_gauges(st: AppState, now: datetime) -> None:
    """Set the 24 h sent and unverified-ratio gauges from the shared hourly counters."""
    hours = [keys.otp_stats(_hour(now - timedelta(hours=h))) for h in range(24)]
    pipe = st.redis.pipeline(transaction=False)
    for key in hours:
        pipe.hgetall(key)
    totals: dict[str, dict[str, int]] = {}
    for bucket in await pipe.execute():
        for field, value in bucket.items():
            type_name, _, what = field.rpartition(":")
            totals.setdefault(type_name, {"sent": 0, "verified": 0})[what] = totals.get(
                type_name, {}
            ).get(what, 0) + int(value)
    for type_name, t in totals.items():
        sent = t.get("sent", 0)
        ratio = 0.0 if sent == 0 else max(0.0, 1.0 - t.get("verified", 0) / sent)
        st.metrics.otp_sent_24h.labels(type_name).set(sent)
        st.metrics.otp_unverified_ratio.labels(type_name).set(ratio)
