"""Pydantic models of the HTTP API bodies, and their mapping onto the Avro contracts.

The Avro schemas in `schemas/` are the source of truth; these models are the HTTP face of the
same records. `AVRO_MAPPING` states, for every model, which Avro record it maps onto and which
API field names differ from the Avro names; tests/api/test_models_agree.py proves that every
API field has an Avro field of a compatible type and that converted records encode round-trip.

Request bodies forbid unknown fields (a typo is a 422, not a silently ignored option).
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import phonenumbers
from pydantic import (
    AliasChoices,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from herald.versions import next_version

Channel = Literal["push", "sms", "email", "inapp"]
Category = Literal["transactional", "marketing", "social"]
TrafficClass = Literal["transactional", "normal", "bulk"]
Platform = Literal["apns", "fcm"]

E164_PATTERN = r"^\+[1-9][0-9]{6,14}$"  # ASCII digits (the API's regex engine's \d is Unicode)
HHMM_PATTERN = r"^([01]\d|2[0-3]):[0-5]\d$"
LOCALE_PATTERN = r"^[A-Za-z]{2,3}(-[A-Za-z0-9]{2,8})*$"
# Deliberately simple (no email-validator dependency): one @, a dot in the domain, no spaces.
EMAIL_PATTERN = r"^[^@\s]{1,64}@[^@\s]+\.[^@\s]{2,}$"
_CATEGORY_CHANNEL = re.compile(r"^(transactional|marketing|social):(push|sms|email|inapp)$")

MAX_RECIPIENTS = 1000
MAX_PARAMS = 50

# Ids: printable ASCII but `{` and `}` (no spaces or control characters; the braces delimit
# Redis Cluster hash tags in the keys built from ids, herald/keys.py); in a URL path, no `/` either.
ID_PATTERN = r"^[\x21-\x7a\x7c\x7e]+$"
PATH_ID_PATTERN = r"^[\x21-\x2e\x30-\x7a\x7c\x7e]+$"
Id = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=ID_PATTERN)]
TypeName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")]
Locale = Annotated[str, StringConstraints(max_length=35, pattern=LOCALE_PATTERN)]
ParamKey = Annotated[str, StringConstraints(min_length=1, max_length=64)]
ParamValue = Annotated[str, StringConstraints(max_length=2000)]
HHMM = Annotated[str, StringConstraints(pattern=HHMM_PATTERN)]


class _Body(BaseModel):
    """Base of request bodies: unknown fields are errors, strings are kept as sent."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Recipients(_Body):
    """Exactly one of `user_ids` (1..1000 distinct ids) or `segment_id`."""

    user_ids: list[Id] | None = Field(default=None, min_length=1, max_length=MAX_RECIPIENTS)
    segment_id: Id | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Recipients:
        if (self.user_ids is None) == (self.segment_id is None):
            raise ValueError("give exactly one of user_ids or segment_id")
        if self.user_ids is not None and len(set(self.user_ids)) != len(self.user_ids):
            raise ValueError("user_ids must be distinct")
        return self


class NotificationCreate(_Body):
    """Body of `POST /v1/notifications`.

    Idempotency: the same `request_id` (or its alias `idempotency_key`) with the same body yields
    the same notification_id; with a different body, 409. Category, priority class, templates
    and bypass rules come from the server-side catalog entry of `notification_type`.
    """

    request_id: Id = Field(validation_alias=AliasChoices("request_id", "idempotency_key"))
    notification_type: TypeName
    recipients: Recipients
    template_version: int | None = Field(default=None, ge=1, le=2**31 - 1)
    params: dict[ParamKey, ParamValue] = Field(default_factory=dict, max_length=MAX_PARAMS)
    channels: list[Channel] | None = Field(default=None, min_length=1, max_length=4)
    send_at: AwareDatetime | None = None
    # "09:00 in each recipient's timezone" (local-time campaigns); exclusive with send_at
    send_local_time: str | None = Field(default=None, pattern=r"^([01]\d|2[0-3]):[0-5]\d$")
    expire_at: AwareDatetime | None = None
    locale: Locale | None = None

    @model_validator(mode="before")
    @classmethod
    def _one_key_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and "request_id" in data and "idempotency_key" in data:
            raise ValueError("give request_id or idempotency_key, not both")
        return data

    @field_validator("channels")
    @classmethod
    def _distinct_channels(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError("channels must be distinct")
        return value

    @model_validator(mode="after")
    def _expiry_after_send(self) -> NotificationCreate:
        if self.send_at and self.send_local_time:
            raise ValueError("give send_at or send_local_time, not both")
        if self.send_at and self.expire_at and self.expire_at <= self.send_at:
            raise ValueError("expire_at must be after send_at")
        return self


class NotificationAccepted(BaseModel):
    """`202` body of `POST /v1/notifications`: the request is durable in Kafka."""

    notification_id: str
    accepted_at: datetime


class QuietHours(_Body):
    """Daily local-time window "HH:MM"-"HH:MM" (24h); may wrap midnight, e.g. 22:00-07:00."""

    start: HHMM
    end: HHMM

    @model_validator(mode="after")
    def _not_empty(self) -> QuietHours:
        if self.start == self.end:
            raise ValueError("quiet hours start and end must differ")
        return self


class PreferencesIn(_Body):
    """Body of `PUT /v1/users/{id}/preferences`; replaces the user's preferences entirely."""

    global_opt_out: bool = False
    category_opt_out: list[Category] = Field(default_factory=list, max_length=3)
    channel_opt_out: list[Channel] = Field(default_factory=list, max_length=4)
    category_channel_opt_out: list[str] = Field(default_factory=list, max_length=12)
    quiet_hours: QuietHours | None = None
    timezone: str | None = Field(default=None, max_length=64)
    locale: Locale | None = None

    @field_validator("category_channel_opt_out")
    @classmethod
    def _pairs(cls, value: list[str]) -> list[str]:
        for pair in value:
            if not _CATEGORY_CHANNEL.match(pair):
                raise ValueError(f"{pair!r} is not 'category:channel' (e.g. 'marketing:sms')")
        return sorted(set(value))

    @field_validator("category_opt_out", "channel_opt_out")
    @classmethod
    def _dedup(cls, value: list[str]) -> list[str]:
        return sorted(set(value))

    @field_validator("timezone")
    @classmethod
    def _iana(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"{value!r} is not an IANA time zone (e.g. Europe/Zurich)") from exc
        return value


class PreferencesOut(PreferencesIn):
    """Body of `GET /v1/users/{id}/preferences`: the stored `user_preferences` record."""

    model_config = ConfigDict(extra="ignore")

    user_id: str
    updated_at: datetime
    version: int


class DeviceRegistration(_Body):
    """Body of `POST /v1/devices`: a push token for a user (re-registering refreshes it)."""

    user_id: Id
    platform: Platform
    token: Annotated[str, StringConstraints(min_length=8, max_length=4096, pattern=r"^\S+$")]
    app_id: Annotated[str, StringConstraints(min_length=1, max_length=255)] | None = None
    # The user's own device (the app registered it after the user signed in); only a key with
    # contact_points:verify may say so. Types marked `secret` (OTP codes) push to these only.
    verified: bool = False


def e164(value: object) -> str:
    """A phone number in canonical E.164 (`+14155550123`), as the phonenumbers library reads
    it: every spelling of one number (spaces, dashes, other scripts' digits) is one text, so
    the OTP limits and the country rules keyed by the number see one number. Raises ValueError
    for what is not a possible international number."""
    if not isinstance(value, str) or len(value) > 40 or not value.strip().startswith("+"):
        raise ValueError("a phone number in international form: + then country code and number")
    try:
        number = phonenumbers.parse(value, None)
    except phonenumbers.NumberParseException as exc:
        raise ValueError(f"not a phone number: {exc}") from None
    if not phonenumbers.is_possible_number(number):
        raise ValueError("not a possible phone number for its country code")
    return str(phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.E164))


class PhoneIn(_Body):
    """A phone number in E.164 form; `verified` is set by the verification flow."""

    e164: Annotated[str, BeforeValidator(e164), StringConstraints(pattern=E164_PATTERN)]
    verified: bool = False


class EmailIn(_Body):
    """An email address; `verified` is set by the verification flow."""

    address: Annotated[str, StringConstraints(max_length=254, pattern=EMAIL_PATTERN)]
    verified: bool = False


class ContactPointsUpdate(_Body):
    """Body of `PUT /v1/users/{id}/contact-points`: set or clear phone and email.

    A field left out is unchanged; an explicit null removes that contact point.
    """

    phone: PhoneIn | None = None
    email: EmailIn | None = None


# model -> (Avro schema name, path of the record inside it, {api field: avro field}).
# A path segment "[]" steps into array items. Fields not listed keep their name.
AVRO_MAPPING: dict[type[BaseModel], tuple[str, tuple[str, ...], dict[str, str]]] = {
    NotificationCreate: ("notification_request", (), {}),
    Recipients: ("notification_request", ("recipients",), {}),
    NotificationAccepted: ("notification_request", (), {}),
    PreferencesIn: ("user_preferences", (), {}),
    PreferencesOut: ("user_preferences", (), {}),
    QuietHours: ("user_preferences", ("quiet_hours",), {}),
    # user_id is the contact_points record's key field, one level up from the device
    DeviceRegistration: ("contact_points", ("devices", "[]"), {"user_id": "../user_id"}),
    ContactPointsUpdate: ("contact_points", (), {}),
    PhoneIn: ("contact_points", ("phone",), {}),
    EmailIn: ("contact_points", ("email",), {}),
}


def to_request_record(
    model: NotificationCreate,
    notification_id: str,
    tenant_id: str,
    traffic_class: TrafficClass,
    accepted_at: datetime,
    source: Literal["api", "producer", "outbox", "digest"] = "api",
    *,
    template_version: int | None = None,
    traceparent: str | None = None,
) -> dict[str, Any]:
    """The `notification_request` record for an accepted API request (traffic_class from the
    catalog, accepted_at = when it is being made durable). `template_version`: the catalog's
    current version of the type, recorded when the request names none, so a campaign planned
    across a catalog change renders the version of its accept."""
    return {
        "notification_id": notification_id,
        "request_id": model.request_id,
        "tenant_id": tenant_id,
        "notification_type": model.notification_type,
        "traffic_class": traffic_class,
        "recipients": {
            "user_ids": list(model.recipients.user_ids or []),
            "segment_id": model.recipients.segment_id,
        },
        "template_version": model.template_version or template_version,
        "params": dict(model.params),
        "channels": list(model.channels) if model.channels is not None else None,
        "locale": model.locale,
        "send_at": model.send_at,
        "send_local_time": model.send_local_time,
        "expire_at": model.expire_at,
        "accepted_at": accepted_at,
        "source": source,
        "traceparent": traceparent,
    }


def to_preferences_record(
    user_id: str, model: PreferencesIn, updated_at: datetime, version: int
) -> dict[str, Any]:
    """The `user_preferences` record replacing the user's preferences with `model`."""
    fields = PreferencesIn.model_fields
    record = model.model_dump(include=set(fields))
    return {"user_id": user_id, **record, "updated_at": updated_at, "version": version}


def preferences_from_record(record: dict[str, Any]) -> PreferencesOut:
    """The API view of a decoded `user_preferences` record."""
    return PreferencesOut.model_validate(record)


def empty_contact_points(user_id: str, updated_at: datetime) -> dict[str, Any]:
    """A `contact_points` record with nothing registered (version 0)."""
    return {
        "user_id": user_id,
        "devices": [],
        "phone": None,
        "email": None,
        "disabled": [],
        "updated_at": updated_at,
        "version": 0,
    }


def with_device(
    current: dict[str, Any], reg: DeviceRegistration, device_id: str, now: datetime
) -> dict[str, Any]:
    """`current` contact points with `reg` added (same token: refreshed and valid again).

    Returns a new record with the next version (herald.versions); `current` is not modified.
    """
    kept = [
        d for d in current["devices"] if d["token"] != reg.token and d["device_id"] != device_id
    ]
    device = {
        "device_id": device_id,
        "platform": reg.platform,
        "token": reg.token,
        "app_id": reg.app_id,
        "registered_at": now,
        "valid": True,
        "verified": reg.verified,
    }
    version = next_version(current["version"])
    return {**current, "devices": [*kept, device], "updated_at": now, "version": version}


def with_contact_update(
    current: dict[str, Any], update: ContactPointsUpdate, now: datetime
) -> dict[str, Any]:
    """`current` contact points with the phone/email fields present in `update` applied; a
    phone or email set again is no longer listed as disabled."""
    changes = {
        name: (value.model_dump() if value is not None else None)
        for name, value in ((n, getattr(update, n)) for n in update.model_fields_set)
    }
    disabled = [d for d in current.get("disabled") or () if changes.get(d) is None]
    return {**current, **changes, "disabled": disabled, "updated_at": now,
            "version": next_version(current["version"])}  # fmt: skip
