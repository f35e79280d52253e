"""Sealed values: what a kept record must not hold past its message's expiry (crypto-shredding).

A dead letter keeps the record no job could process (a delivery with its OTP code and phone
number, a request with its params) for the dead-letter topic's retention, 30 days. Kafka cannot
delete one record, so its value is sealed instead: AES-256-GCM under a data key of the hour in
which it stops being useful, the **shred hour** — the hour its message expires, or, for a record
without an expiry, the hour its replay window ends (`HERALD_PII_DEAD_LETTER_REPLAY_DAYS`, 7 days
by default). The keys live only in Redis, one per hour (`seal:key:<yyyymmddhh>`, 32 random
bytes, set once by whichever process needs it first), and expire at the end of their hour: from
then on nobody (the replay tools, an operator reading the topic, a copy of the broker's disks)
can read the value again. A record whose message has already expired is not kept at all.

    Sealer(redis_client).seal(plain, shred_at) -> bytes | None   None: nothing worth keeping
    Sealer.open(value) -> bytes | None                            None: shredded (key gone)
    Sealer.readable(value) -> (plain, None) | (None, why)         for the replay tools
    is_sealed(value) -> bool

The same seal keeps the content of a **secret** notification type (catalog `secret`: an OTP
code, a password-reset link) out of every delivery record Kafka keeps (deliveries, retries,
dead letters, 7-30 days): the plan job moves the delivery's `address`, `rendered` and
`fallback_content` into its `sealed` field (`seal_delivery`, leaving them empty) and dispatch
opens them just before the send (`open_delivery`). The jobs in between carry the record as is.
Dispatch seals every retry record it writes the same way, whatever its type: the retry topics
keep them for days, longer than most messages live.

    seal_delivery(sealer, delivery) -> delivery     (unchanged when already sealed)
    open_delivery(sealer, delivery) -> (delivery, None) | (None, why)

Format: b"HSL1" + the hour (10 ASCII digits) + a 12-byte nonce + ciphertext and tag; the first
14 bytes are the associated data, so a value cannot be moved under another hour's key.

A Redis that lost its data has lost the keys: dead letters sealed before that can no longer be
replayed (stated in the README). A Redis that cannot be reached when a record is sealed makes
`seal` raise `SealUnavailable`; the caller keeps the letter without its value.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from herald.errors import SealUnavailable

__all__ = [
    "MAGIC",
    "SEALED_FIELDS",
    "Sealer",
    "is_sealed",
    "key_name",
    "open_delivery",
    "seal_delivery",
    "shred_hour",
]

MAGIC = b"HSL1"
_HOUR_FORMAT = "%Y%m%d%H"
_HEADER = len(MAGIC) + 10
_NONCE = 12
# What a secret type's delivery keeps only sealed, and what stands in its place meanwhile.
SEALED_FIELDS = ("address", "rendered", "fallback_content")
_EMPTY: dict[str, Any] = {
    "address": None,
    "rendered": {"title": None, "body": "", "subject": None, "data": {}},
    "fallback_content": [],
}
_NO_EXPIRY = timedelta(days=1)  # a delivery always has one; this is a floor, never used


def is_sealed(value: bytes | None) -> bool:
    """True for a value made by `Sealer.seal`."""
    return value is not None and value[: len(MAGIC)] == MAGIC and len(value) > _HEADER + _NONCE


def shred_hour(shred_at: datetime | int) -> datetime:
    """The start of the hour whose key seals a value useless after `shred_at` (an aware
    datetime, or epoch milliseconds as some records carry it): the hour that ends at or after
    it (a value useful until 10:20 is sealed under 10:00-11:00's key)."""
    if not isinstance(shred_at, datetime):
        shred_at = datetime.fromtimestamp(shred_at / 1000, UTC)
    return shred_at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def key_name(hour: str) -> str:
    """The Redis key of an hour's data key (`hour` as yyyymmddhh)."""
    return f"seal:key:{hour}"


class Sealer:
    """Seals and opens values with the hourly keys in Redis (a `redis.Redis`, sync)."""

    def __init__(self, client: Any, now: Any = None) -> None:
        self.client = client
        self._now = now or (lambda: datetime.now(UTC))
        self._keys: dict[str, bytes] = {}

    def seal(self, plain: bytes, shred_at: datetime | int) -> bytes | None:
        """`plain` sealed under the key of `shred_at`'s hour; None when that hour is over
        (the record would be unreadable at once: keep nothing)."""
        hour = shred_hour(shred_at)
        now = self._now()
        if hour + timedelta(hours=1) <= now:
            return None
        label = hour.strftime(_HOUR_FORMAT)
        key = self._key(label, hour + timedelta(hours=1), now)
        header = MAGIC + label.encode()
        nonce = os.urandom(_NONCE)
        return header + nonce + AESGCM(key).encrypt(nonce, plain, header)

    def open(self, value: bytes) -> bytes | None:
        """The plain value of a sealed one; None when its hour's key is gone (shredded). Raises
        ValueError for a value that is not sealed or was altered."""
        if not is_sealed(value):
            raise ValueError("not a sealed value")
        header, nonce = value[:_HEADER], value[_HEADER : _HEADER + _NONCE]
        body = value[_HEADER + _NONCE :]
        label = header[len(MAGIC) :].decode()
        hour = datetime.strptime(label, _HOUR_FORMAT).replace(tzinfo=UTC)
        if hour + timedelta(hours=1) <= self._now():
            return None  # its hour is over: shredded, whatever a cache or a late expiry holds
        key = self._keys.get(label)
        if key is None:
            try:
                key = self.client.get(key_name(label))
            except Exception as exc:  # noqa: BLE001 - redis errors of any kind
                raise SealUnavailable(f"key of {label}: {exc}") from exc
            if key is None:
                return None
            self._keys[label] = key
        try:
            return bytes(AESGCM(key).decrypt(nonce, body, header))
        except Exception as exc:  # InvalidTag: altered, or not this hour's key
            raise ValueError("sealed value altered or under another key") from exc

    def readable(self, value: bytes) -> tuple[bytes | None, str | None]:
        """A kept value as it can be used now: (plain, None) — an unsealed value as it is — or
        (None, why): `shredded`, `seal_key_unavailable` (Redis unreachable), `seal_altered`."""
        if not is_sealed(value):
            return value, None
        try:
            plain = self.open(value)
        except SealUnavailable:
            return None, "seal_key_unavailable"
        except ValueError:
            return None, "seal_altered"
        return (plain, None) if plain is not None else (None, "shredded")

    def _key(self, label: str, ends: datetime, now: datetime) -> bytes:
        key = self._keys.get(label)
        if key is not None:
            return key
        for old in [k for k in self._keys if k < now.strftime(_HOUR_FORMAT)]:
            del self._keys[old]
        try:
            name = key_name(label)
            self.client.set(name, os.urandom(32), nx=True, exat=int(ends.timestamp()))
            key = self.client.get(name)
        except Exception as exc:  # noqa: BLE001 - redis errors of any kind
            raise SealUnavailable(f"key of {label}: {exc}") from exc
        if key is None:  # expired between the two calls: the hour is over
            raise SealUnavailable(f"key of {label} expired")
        self._keys[label] = key
        return bytes(key)


def seal_delivery(sealer: Sealer, delivery: dict[str, Any]) -> dict[str, Any]:
    """`delivery` with its address and content sealed in `sealed` until it expires, the
    fields themselves emptied; unchanged when it is sealed already (the jobs that carry it)."""
    if delivery.get("sealed") is not None:
        return delivery
    plain = orjson.dumps({name: delivery.get(name) for name in SEALED_FIELDS})
    shred_at = delivery.get("expire_at") or shred_hour(delivery["created_at"]) + _NO_EXPIRY
    sealed = sealer.seal(plain, shred_at)
    return {**delivery, **_EMPTY, "sealed": sealed if sealed is not None else b""}


def open_delivery(
    sealer: Sealer, delivery: dict[str, Any]
) -> tuple[dict[str, Any] | None, str | None]:
    """`delivery` with its sealed fields back (and `sealed` cleared), or (None, why) when they
    can no longer be read (`shredded`: expired; `seal_key_unavailable`; `seal_altered`)."""
    blob = delivery.get("sealed")
    if blob is None:
        return delivery, None
    plain, why = sealer.readable(blob) if is_sealed(blob) else (None, "shredded")
    if plain is None:
        return None, why
    return {**delivery, **orjson.loads(plain), "sealed": None}, None
