"""herald.sealing and the dead-letter sealer: a kept value is readable until its message
expires, then never again (its hour's key is gone from Redis); nothing is kept for a message
already expired; a Redis that cannot be reached costs the value, never the letter or the job."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from herald.config import HeraldSettings, RedisSettings
from herald.dead_letters import dead_letter
from herald.sealing import Sealer, is_sealed, key_name
from sinks.kafka import DeadLetterSealer

OTP = b'{"address": "+41791234567", "rendered": {"body": "Your login code is 482913"}}'


class Clock:
    def __init__(self, at: datetime) -> None:
        self.at = at

    def __call__(self) -> datetime:
        return self.at


def test_a_sealed_value_opens_until_its_hour_ends_and_never_after(
    settings: HeraldSettings,
) -> None:
    client = settings.redis.client()
    clock = Clock(datetime.now(UTC))
    expires = clock.at + timedelta(minutes=5)
    sealed = Sealer(client, now=clock).seal(OTP, expires)
    assert sealed is not None and is_sealed(sealed)
    assert b"482913" not in sealed and b"+4179" not in sealed
    assert Sealer(client, now=clock).open(sealed) == OTP  # another process: the key is shared
    hour = expires.replace(minute=0, second=0, microsecond=0)
    ttl = client.ttl(key_name(hour.strftime("%Y%m%d%H")))
    assert 0 < ttl <= (hour + timedelta(hours=1) - clock.at).total_seconds() + 1
    reader = Sealer(client, now=clock)
    assert reader.open(sealed) == OTP  # cached now
    clock.at = hour + timedelta(hours=1)
    assert reader.open(sealed) is None  # the hour is over: shredded, whatever the cache holds
    assert reader.readable(sealed) == (None, "shredded")


def test_a_value_of_an_expired_message_is_not_kept_and_an_altered_one_is_refused(
    settings: HeraldSettings,
) -> None:
    sealer = Sealer(settings.redis.client())
    assert sealer.seal(OTP, datetime.now(UTC) - timedelta(hours=2)) is None
    sealed = sealer.seal(OTP, datetime.now(UTC) + timedelta(minutes=1))
    assert sealed is not None
    altered = sealed[:-1] + bytes([sealed[-1] ^ 1])
    assert sealer.readable(altered) == (None, "seal_altered")
    assert sealer.readable(b"plain, from before sealing") == (b"plain, from before sealing", None)


def test_the_dead_letter_sealer_uses_the_expiry_or_the_replay_window(
    settings: HeraldSettings,
) -> None:
    seal = DeadLetterSealer(settings)
    now = datetime.now(UTC)
    otp = dead_letter(source_topic="t", reason="retries_exhausted", detail="", job="dispatch",
                      value=OTP, expire_at=now + timedelta(minutes=5))  # fmt: skip
    sealed = seal(otp)
    assert is_sealed(sealed["value"]) and sealed["expire_at"] == otp["expire_at"]
    late = seal({**otp, "expire_at": now - timedelta(hours=2)})
    assert late["value"] is None and "value not kept: its message had expired" in late["detail"]
    undecodable = dead_letter(source_topic="t", reason="bad_magic_byte", detail="", job="plan",
                              value=b"garbage", failed_at=now)  # fmt: skip
    opened = Sealer(settings.redis.client()).open(seal(undecodable)["value"])
    assert opened == b"garbage"  # kept for the replay window (7 days by default)
    assert settings.pii.dead_letter_replay_days == 7


def test_without_redis_the_letter_is_kept_without_its_value(settings: HeraldSettings) -> None:
    down = settings.model_copy(update={"redis": RedisSettings(url="redis://127.0.0.1:1/0")})
    letter = dead_letter(source_topic="t", reason="retries_exhausted", detail="d",
                         job="dispatch", value=OTP, delivery_id=str(uuid.uuid4()),
                         expire_at=datetime.now(UTC) + timedelta(minutes=5))  # fmt: skip
    kept = DeadLetterSealer(down)(letter)
    assert kept["value"] is None and kept["delivery_id"] == letter["delivery_id"]
    assert kept["detail"] == "d (value not kept: could not be sealed)"


@pytest.mark.parametrize("minutes", [0, 59])
def test_the_shred_hour_is_the_hour_the_value_stops_being_useful(minutes: int) -> None:
    from herald.sealing import shred_hour

    at = datetime(2026, 12, 2, 10, minutes, 30, tzinfo=UTC)
    assert shred_hour(at) == datetime(2026, 12, 2, 10, tzinfo=UTC)
    assert shred_hour(int(at.timestamp() * 1000)) == shred_hour(at)  # epoch ms, as records carry
