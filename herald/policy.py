"""The per user × channel send decision (seed 000 §5.4, seed 001). Pure: no I/O, no clock.

`decide(catalog, request, prefs, contacts, now_utc, cap_count)` returns one decision per channel
considered, checked in the seeds' order (the first failing check gives the reason):

0. the notification was cancelled (`PolicyRequest.cancelled`, herald.controls) → `cancelled`;
1. global opt-out → `global_opt_out`;  2. category opt-out → `category_opt_out`
   (both skipped by `bypass_opt_out`, which only approved transactional types have);
3. per channel: not allowed for the type → `channel_not_allowed`; channel or category×channel
   opt-out → `channel_opt_out`; availability → `no_contact_point`, `address_disabled` (the
   phone or email was removed after a provider reported it dead), `no_valid_token`,
   `phone_unverified`, `email_unverified` (unverified is fine for `allow_unverified_contact`),
   `device_unverified` (a `secret` type, such as an OTP, is pushed to verified devices only).
   An unavailable primary channel falls back along the type's fallback graph at plan time
   (within the caller's `channels`): the result is `Suppress(primary)` + `Send(alt)`;
4. quiet hours in the user's zone at the instant the send is due (`send_at` when ahead, else
   now; only on the catalog's `quiet_hours_channels`; skipped by `bypass_quiet_hours`) →
   `Hold(until=window end, reason="quiet_hours")`; else `send_at` in the future →
   `Hold(reason="scheduled")`: held, never dropped. A hold ending at or after the expiry is
   `Suppress("expired")` instead. The expiry of a scheduled send counts from its `send_at`
   (`PolicyRequest.expires`);
5. frequency cap (non-transactional types with a bucket): `cap_count >= limit` → `frequency_cap`;
6. expiry: `now >= expire_at` → `Suppress("expired")` (state EXPIRED);
7. escalation (a type with one, herald.catalog.Escalation): a message on its `from` channel
   adds `Hold(to channel, until=its send time + after, reason="escalation")` when the user can
   be reached there; dispatch drops it if the first was read by then.

Holds are re-decided on release (preferences may change meanwhile). `Hold.planned` is the Send
the hold would become. Channel choice: the caller's `channels` ∩ the type's channels (plus
fallback channels the caller names) in catalog preference order; the type's channels when unset.

Push is decided per user × push with every valid device token (`Send.addresses`); the plan job
emits one Delivery per address with `delivery_id(nid, user, "push", device_id)`, so a dead
token fails and is removed alone while the other devices are still served (see `herald.ids`).

A user without a time zone gets the catalog's explicit `default_timezone`. Bad input raises:
`InvalidLocale`/`UnknownTemplateVersion`/`UnknownNotificationType` (CatalogLookupError) and
`InvalidTimezone`/`InvalidTimeOfDay` from `from_record`; the plan job dead-letters them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from typing import Any, NamedTuple

from herald.catalog import Catalog, NotificationType, reachable_channels
from herald.catalog_fields import normalize_locale
from herald.quiet_hours import QuietWindow, get_zone, quiet_until
from herald.states import State

__all__ = [
    "Address",
    "ContactPoints",
    "Decision",
    "Device",
    "Hold",
    "PolicyRequest",
    "Preferences",
    "Send",
    "Suppress",
    "decide",
    "quiet_end",
]


def _instant(value: Any) -> datetime | None:
    """Avro timestamp-millis as decoded (aware datetime) or raw epoch millis → aware datetime."""
    if value is None or isinstance(value, datetime):
        if value is not None and value.tzinfo is None:
            raise ValueError("timestamps must be timezone-aware")
        return value
    return datetime.fromtimestamp(int(value) / 1000, UTC)


_INTERNED: dict[tuple[Any, ...], tuple[Any, ...]] = {}
MAX_INTERNED = 1_000_000


def interned(key: tuple[Any, ...]) -> tuple[Any, ...]:
    """One object per distinct policy key (the first `MAX_INTERNED` keys), so that the keys of
    millions of users are a few shared objects: they compare by identity and stay in the CPU
    cache (dataflows/plan/planned_alike.py looks one up per planned user)."""
    found = _INTERNED.get(key)
    if found is not None:
        return found
    if len(_INTERNED) < MAX_INTERNED:
        _INTERNED[key] = key
    return key


def _reduce(obj: Any) -> tuple[Any, ...]:
    """Pickle a dataclass by its init fields: unpickling runs `__post_init__`."""
    return (type(obj), tuple(getattr(obj, f.name) for f in fields(obj) if f.init))


_new, _set = object.__new__, object.__setattr__


@dataclass(frozen=True, slots=True)
class Preferences:
    """A user's latest preferences (the `UserPreferences` record)."""

    user_id: str
    global_opt_out: bool = False
    category_opt_out: frozenset[str] = frozenset()
    channel_opt_out: frozenset[str] = frozenset()
    category_channel_opt_out: frozenset[str] = frozenset()  # "marketing:sms"
    quiet_hours: QuietWindow | None = None
    timezone: str | None = None
    locale: str | None = None
    version: int = 0
    # Every field `decide` and the plan job read (all but user_id and version): users with the
    # same key are planned alike (dataflows/plan/planned_alike.py). Made once per preferences
    # record.
    policy_key: tuple[Any, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        key = (
            self.global_opt_out, self.category_opt_out, self.channel_opt_out,
            self.category_channel_opt_out, self.quiet_hours, self.timezone, self.locale,
        )  # fmt: skip
        object.__setattr__(self, "policy_key", interned(key))

    def __reduce__(self) -> tuple[Any, ...]:
        return _reduce(self)  # unpickled through __init__: the key is interned here too

    def for_user(self, user_id: str, version: int) -> Preferences:
        """These choices as `user_id`'s at `version`, without validating them again or making
        the policy key (~2.5x cheaper than `__init__`: the plan job makes one per planned user
        from a copy whose choices it has seen, dataflows/_user_copies.py)."""
        made = _new(Preferences)
        _set(made, "user_id", user_id)
        _set(made, "global_opt_out", self.global_opt_out)
        _set(made, "category_opt_out", self.category_opt_out)
        _set(made, "channel_opt_out", self.channel_opt_out)
        _set(made, "category_channel_opt_out", self.category_channel_opt_out)
        _set(made, "quiet_hours", self.quiet_hours)
        _set(made, "timezone", self.timezone)
        _set(made, "locale", self.locale)
        _set(made, "version", version)
        _set(made, "policy_key", self.policy_key)
        return made

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> Preferences:
        """Validate a decoded record; raises InvalidTimezone/InvalidTimeOfDay/InvalidLocale."""
        quiet = rec.get("quiet_hours")
        tz = rec.get("timezone")
        if tz is not None:
            get_zone(tz)
        locale = rec.get("locale")
        return cls(
            user_id=rec["user_id"],
            global_opt_out=bool(rec.get("global_opt_out", False)),
            category_opt_out=frozenset(rec.get("category_opt_out") or ()),
            channel_opt_out=frozenset(rec.get("channel_opt_out") or ()),
            category_channel_opt_out=frozenset(rec.get("category_channel_opt_out") or ()),
            quiet_hours=QuietWindow.parse(quiet["start"], quiet["end"]) if quiet else None,
            timezone=tz,
            locale=normalize_locale(locale) if locale else None,
            version=int(rec.get("version", 0)),
        )


class Device(NamedTuple):
    """One registered push endpoint. A NamedTuple: the plan job makes one per device of every
    user it reads (dataflows/_user_copies.py), ~7x cheaper than a frozen dataclass."""

    device_id: str
    platform: str  # apns | fcm
    token: str
    app_id: str | None = None
    valid: bool = True
    verified: bool = False  # registered by a key holding contact_points:verify (catalog `secret`)

    @property
    def address(self) -> Address:
        """The device as a push address (the platform names the provider)."""
        return Address(self.token, self.platform, self.device_id, self.platform, self.app_id)


@dataclass(frozen=True, slots=True)
class ContactPoints:
    """A user's current contact points (the `ContactPoints` record)."""

    user_id: str
    devices: tuple[Device, ...] = ()
    phone: str | None = None
    phone_verified: bool = False
    email: str | None = None
    email_verified: bool = False
    version: int = 0
    disabled: frozenset[str] = frozenset()  # "phone"/"email" a provider reported dead
    # What `decide` reads besides the endpoints' values and device ids: users with the same key
    # get the same decisions for other addresses (dataflows/plan/planned_alike.py).
    policy_key: tuple[Any, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        devices = tuple([(d.valid, d.platform, d.app_id, d.verified) for d in self.devices])
        key = (devices, bool(self.phone), self.phone_verified, bool(self.email),
               self.email_verified, self.disabled)  # fmt: skip
        object.__setattr__(self, "policy_key", interned(key))

    def __reduce__(self) -> tuple[Any, ...]:
        return _reduce(self)

    def for_user(self, user_id: str, version: int) -> ContactPoints:
        """These contact points as `user_id`'s at `version`, as `Preferences.for_user` (the
        plan job's "none" for a user without a copy)."""
        return self.with_addresses(user_id, version, self.devices, self.phone, self.email)

    def with_addresses(
        self,
        user_id: str,
        version: int,
        devices: tuple[Device, ...],
        phone: str | None,
        email: str | None,
    ) -> ContactPoints:
        """`user_id`'s contact points at `version`: these addresses, with this one's verified
        flags, disabled kinds and policy key, made without `__init__` (the plan job, for a user
        whose devices' kinds and flags it has seen: the key is the same,
        dataflows/_user_copies.py)."""
        made = _new(ContactPoints)
        _set(made, "user_id", user_id)
        _set(made, "devices", devices)
        _set(made, "phone", phone)
        _set(made, "phone_verified", self.phone_verified)
        _set(made, "email", email)
        _set(made, "email_verified", self.email_verified)
        _set(made, "version", version)
        _set(made, "disabled", self.disabled)
        _set(made, "policy_key", self.policy_key)
        return made

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> ContactPoints:
        """From a decoded record."""
        phone, email = rec.get("phone") or {}, rec.get("email") or {}
        devices = tuple(
            Device(
                d["device_id"],
                d["platform"],
                d["token"],
                d.get("app_id"),
                d.get("valid", True),
                bool(d.get("verified", False)),
            )
            for d in rec.get("devices") or ()
        )
        return cls(
            user_id=rec["user_id"],
            devices=devices,
            phone=phone.get("e164"),
            phone_verified=bool(phone.get("verified", False)),
            email=email.get("address"),
            email_verified=bool(email.get("verified", False)),
            version=int(rec.get("version", 0)),
            disabled=frozenset(rec.get("disabled") or ()),
        )


@dataclass(frozen=True, slots=True)
class PolicyRequest:
    """What the policy needs from a `NotificationRequest` (one user's view of it)."""

    notification_type: str
    channels: tuple[str, ...] | None = None
    locale: str | None = None
    template_version: int | None = None
    send_at: datetime | None = None
    expire_at: datetime | None = None
    accepted_at: datetime | None = None
    cancelled: bool = False  # cancelled through the API (herald.controls): nothing is sent

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> PolicyRequest:
        """From a decoded `NotificationRequest` record."""
        channels = rec.get("channels")
        return cls(
            notification_type=rec["notification_type"],
            channels=tuple(channels) if channels is not None else None,
            locale=rec.get("locale"),
            template_version=rec.get("template_version"),
            send_at=_instant(rec.get("send_at")),
            expire_at=_instant(rec.get("expire_at")),
            accepted_at=_instant(rec.get("accepted_at")),
        )

    def expires(self, nt: NotificationType) -> datetime | None:
        """`expire_at`, else the type's expiry counted from when the send is due: `send_at`
        when it is after `accepted_at` (a campaign scheduled days ahead is not expired by the
        time it is due), else `accepted_at`; None without either."""
        if self.expire_at is not None:
            return self.expire_at
        start = self.accepted_at
        if self.send_at is not None and (start is None or self.send_at > start):
            start = self.send_at
        return start + nt.expiry if start is not None else None


class Address(NamedTuple):
    """One endpoint: token (push), E.164 (sms), address (email) or user id (inapp). A
    NamedTuple: one is made per planned user and channel, 3x faster than a frozen dataclass."""

    value: str
    platform: str | None = None
    device_id: str | None = None
    provider: str | None = None
    app_id: str | None = None


@dataclass(frozen=True, slots=True)
class Send:
    """Send on `channel` to every address; `fallback` = remaining steps for dispatch."""

    channel: str
    addresses: tuple[Address, ...]
    locale: str
    provider: str | None
    fallback: tuple[str, ...]
    expire_at: datetime | None
    not_before: datetime | None = None
    fallback_from: str | None = None
    state = State.PLANNED


@dataclass(frozen=True, slots=True)
class Hold:
    """Hold until `until` (UTC), then decide again; `planned` is what would be sent."""

    channel: str
    until: datetime
    reason: str  # quiet_hours | scheduled
    planned: Send
    state = State.SCHEDULED


@dataclass(frozen=True, slots=True)
class Suppress:
    """Do not send on `channel`; `reason` is machine-readable."""

    channel: str
    reason: str

    @property
    def state(self) -> State:
        """EXPIRED for expiry, SUPPRESSED otherwise."""
        return State.EXPIRED if self.reason == "expired" else State.SUPPRESSED


Decision = Send | Hold | Suppress


def decide(
    catalog: Catalog,
    request: PolicyRequest,
    prefs: Preferences,
    contacts: ContactPoints,
    now_utc: datetime,
    cap_count: int = 0,
) -> list[Decision]:
    """Decide every channel of one user for one notification (see the module docstring)."""
    if now_utc.tzinfo is None:
        raise ValueError("now_utc must be timezone-aware")
    nt = catalog.get(request.notification_type)
    primaries, permitted, out = _channels(nt, request)
    if request.cancelled:
        return [*out, *(Suppress(c, "cancelled") for c in primaries)]
    user_reason = _user_opt_out(nt, prefs)
    if user_reason is not None:
        return [*out, *(Suppress(c, user_reason) for c in primaries)]
    hold = _Holds(catalog, nt, request, prefs, now_utc)
    for channel, addresses, via in _choose(nt, primaries, permitted, prefs, contacts, out):
        send = _send(catalog, nt, request, prefs, channel, addresses, via, permitted)
        out.append(_timing(nt, hold, send, now_utc, cap_count))
    if nt.escalation is not None:
        _escalate(catalog, nt, request, prefs, contacts, now_utc, out)
    return out


def _escalate(
    catalog: Catalog, nt: NotificationType, request: PolicyRequest, prefs: Preferences,
    contacts: ContactPoints, now: datetime, out: list[Decision],
) -> None:  # fmt: skip
    """Step 7, escalation: a message sent (or held) on the escalation's `from` channel gets a
    hold on its `to` channel until `after` past its send time (reason `escalation`); dispatch
    drops it when the first one was read by then (herald.catalog.Escalation). Nothing when
    the user cannot be reached on `to`, or the hold would end past the expiry."""
    rule = nt.escalation
    assert rule is not None
    first = next((d for d in out if d.channel == rule.from_channel
                  and isinstance(d, Send | Hold)), None)  # fmt: skip
    if first is None:
        return
    addresses = _usable(nt, rule.to_channel, prefs, contacts)  # opt-outs, availability
    if isinstance(addresses, str):
        return
    start = first.until if isinstance(first, Hold) else now
    send = _send(catalog, nt, request, prefs, rule.to_channel, addresses, None, frozenset())
    until = start + rule.after
    if send.expire_at is not None and until >= send.expire_at:
        return
    out.append(Hold(rule.to_channel, until, "escalation", replace(send, not_before=until)))


def _channels(
    nt: NotificationType, request: PolicyRequest
) -> tuple[list[str], frozenset[str], list[Decision]]:
    """(primary channels, channels fallback may use, channel_not_allowed suppressions)."""
    allowed = nt.allowed_channels
    if request.channels is None:
        return list(nt.channels), frozenset(allowed), []
    wanted = dict.fromkeys(request.channels)
    rejected: list[Decision] = [
        Suppress(c, "channel_not_allowed") for c in wanted if c not in allowed
    ]
    primaries = [c for c in allowed if c in wanted]
    return primaries, frozenset(primaries), rejected


def _user_opt_out(nt: NotificationType, prefs: Preferences) -> str | None:
    if nt.bypass_opt_out:
        return None
    if prefs.global_opt_out:
        return "global_opt_out"
    if nt.category in prefs.category_opt_out:
        return "category_opt_out"
    return None


def _choose(
    nt: NotificationType,
    primaries: list[str],
    permitted: frozenset[str],
    prefs: Preferences,
    contacts: ContactPoints,
    out: list[Decision],
) -> list[tuple[str, tuple[Address, ...], str | None]]:
    """Usable (channel, addresses, replaced primary) in order; appends Suppress for the rest."""
    chosen: list[tuple[str, tuple[Address, ...], str | None]] = []
    used: set[str] = set()
    for primary in primaries:
        found = _usable(nt, primary, prefs, contacts)
        if not isinstance(found, str):
            if primary not in used:
                chosen.append((primary, found, None))
                used.add(primary)
            continue
        out.append(Suppress(primary, found))
        for alt in reachable_channels((primary,), nt.fallback)[1:]:
            if alt in permitted and alt not in used and alt not in primaries:
                alt_found = _usable(nt, alt, prefs, contacts)
                if not isinstance(alt_found, str):
                    chosen.append((alt, alt_found, primary))
                    used.add(alt)
                    break
    return chosen


def _usable(
    nt: NotificationType, channel: str, prefs: Preferences, contacts: ContactPoints
) -> tuple[Address, ...] | str:
    """The channel's addresses, or the reason it cannot be used (opt-out or availability)."""
    if not nt.bypass_opt_out and (
        channel in prefs.channel_opt_out
        or f"{nt.category}:{channel}" in prefs.category_channel_opt_out
    ):
        return "channel_opt_out"
    if channel == "push":
        if not contacts.devices:
            return "no_contact_point"
        valid = tuple([d.address for d in contacts.devices
                       if d.valid and (d.verified or not nt.secret)])  # fmt: skip
        if valid:
            return valid
        return "device_unverified" if any(d.valid for d in contacts.devices) else "no_valid_token"
    if channel == "sms":
        return _verified(contacts.phone, contacts.phone_verified, nt, "phone_unverified",
                         "phone" in contacts.disabled)  # fmt: skip
    if channel == "email":
        return _verified(contacts.email, contacts.email_verified, nt, "email_unverified",
                         "email" in contacts.disabled)  # fmt: skip
    return (Address(contacts.user_id),)  # inapp: the inbox is always there


def _verified(
    value: str | None, verified: bool, nt: NotificationType, reason: str, disabled: bool
) -> tuple[Address, ...] | str:
    if not value:
        return "address_disabled" if disabled else "no_contact_point"
    if not verified and not nt.allow_unverified_contact:
        return reason
    return (Address(value),)


def _send(
    catalog: Catalog,
    nt: NotificationType,
    request: PolicyRequest,
    prefs: Preferences,
    channel: str,
    addresses: tuple[Address, ...],
    via: str | None,
    permitted: frozenset[str],
) -> Send:
    requested_locale = request.locale or prefs.locale
    locale = catalog.resolve_locale(nt, channel, requested_locale, request.template_version)
    key = ("policy.fallback", nt.name, channel, permitted)
    steps = catalog.memo.get(key)
    if steps is None:
        steps = _fallback_steps(nt, channel, permitted)
        catalog.remember(key, steps)
    provider = nt.providers.get(channel)
    if provider is not None:  # (dataclasses.replace costs 3x the constructor)
        addresses = tuple(
            [a if a.provider else Address(a.value, a.platform, a.device_id, provider, a.app_id)
             for a in addresses]
        )  # fmt: skip
    return Send(channel, addresses, locale, provider, steps, request.expires(nt), None, via)


def _fallback_steps(
    nt: NotificationType, channel: str, permitted: frozenset[str]
) -> tuple[str, ...]:
    """Remaining dispatch steps after `channel` (provider failover first), transitively."""
    steps: list[str] = []
    queue = [channel]
    while queue:
        for step in nt.fallback.get(queue.pop(0), ()):
            target = step.split(":", 1)[0]
            if (target in permitted or target == channel) and step not in steps:
                steps.append(step)
                if target != channel:
                    queue.append(target)
    return tuple(s for s in steps if s != channel)


def _timing(nt: NotificationType, holds: _Holds, send: Send, now: datetime, cap: int) -> Decision:
    """Steps 4-6: hold (scheduled, quiet hours), frequency cap, expiry."""
    expire_at = send.expire_at
    hold = holds.for_channel(send.channel)
    if hold is not None:
        until, reason = hold
        if expire_at is not None and until >= expire_at:
            return Suppress(send.channel, "expired")
        return Hold(send.channel, until, reason, replace(send, not_before=until))
    if nt.cap is not None and not nt.transactional and cap >= nt.cap.daily_limit:
        return Suppress(send.channel, "frequency_cap")
    if expire_at is not None and now >= expire_at:
        return Suppress(send.channel, "expired")
    return send


class _Holds:
    """Why and until when a user's sends wait (computed at most once per decide call): quiet
    hours are those of the instant the send is due (`send_at` when it is ahead, else now), so a
    send scheduled into the user's quiet window waits for its end."""

    __slots__ = ("_catalog", "_prefs", "_scheduled", "_due", "_quiet", "_quiet_done")

    def __init__(
        self,
        catalog: Catalog,
        nt: NotificationType,
        request: PolicyRequest,
        prefs: Preferences,
        now: datetime,
    ) -> None:
        self._catalog, self._prefs = catalog, prefs
        send_at = request.send_at
        self._scheduled = send_at if send_at is not None and send_at > now else None
        self._due = self._scheduled or now
        self._quiet: datetime | None = None
        self._quiet_done = nt.bypass_quiet_hours or prefs.quiet_hours is None

    def for_channel(self, channel: str) -> tuple[datetime, str] | None:
        quiet = self._quiet_end(channel)
        if quiet is not None:
            return quiet, "quiet_hours"
        if self._scheduled is not None:
            return self._scheduled, "scheduled"
        return None

    def _quiet_end(self, channel: str) -> datetime | None:
        if self._quiet_done and self._quiet is None:
            return None
        if channel not in self._catalog.quiet_hours_channels:
            return None
        if not self._quiet_done:
            self._quiet = _quiet_until(self._catalog, self._prefs, self._due)
            self._quiet_done = True
        return self._quiet


def quiet_end(
    catalog: Catalog, nt: NotificationType, prefs: Preferences, channel: str, at: datetime
) -> datetime | None:
    """When the user's quiet hours that hold a send of `nt` on `channel` at `at` end; None when
    none do (`decide`'s rule, step 4; dispatch applies it again just before sending)."""
    if nt.bypass_quiet_hours or channel not in catalog.quiet_hours_channels:
        return None
    return _quiet_until(catalog, prefs, at)


def _quiet_until(catalog: Catalog, prefs: Preferences, at: datetime) -> datetime | None:
    return quiet_until(at, prefs.quiet_hours, prefs.timezone or catalog.default_timezone)
