"""The server-side notification-type catalog (`herald/catalog.toml`), loaded once and validated.

Callers name a notification type; the catalog decides its category, traffic class, channels and
fallback graph, templates (per version, channel and locale), bypass rules, expiry, digest window
and frequency-cap bucket. The file format is documented at the top of `catalog.toml`.

`load_catalog()` validates everything up front; every error is a `ConfigError` naming the type and
field (`types.otp_login.expiry_seconds: ...`); unknown fields are errors too (typos). Each module
parses the section it interprets: this one the catalog and type skeleton, `herald.templates` the
`templates` tables (syntax, and every variable must be a declared param), `herald.digest_config`
the `digest` tables, all with `herald.catalog_fields.Fields`; they sit below this module, and
`herald.render` and `herald.digest` (which read a loaded catalog) above it. Bypass flags are
accepted only on transactional types with `approved = true`.

Lookups against a loaded catalog raise a `CatalogLookupError` carrying a machine code:

    CatalogLookupError (code)
    ├── UnknownNotificationType   unknown_notification_type
    └── TemplateError
        ├── UnknownTemplateVersion    unknown_template_version
        ├── NoTemplate                no_template:<channel>
        ├── InvalidLocale             invalid_locale
        ├── MissingParam              missing_param:<name>        (raised by herald.render)
        └── RenderFailed              render_failed               (raised by herald.render)

Locale fallback: the requested tag, then its parents (`pt-BR` → `pt`), then the type's
`default_locale`, then the catalog's `default_locale`. Tags are normalized (`pt_br` → `pt-BR`).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from herald.catalog_fields import Fields, ParseContext, locale_parents, normalize_locale
from herald.digest_config import DigestConfig, parse_digest_config
from herald.errors import (
    ConfigError,
    InvalidTimezone,
    NoTemplate,
    UnknownNotificationType,
    UnknownTemplateVersion,
)
from herald.quiet_hours import get_zone
from herald.templates import TemplateSet, parse_templates

__all__ = [
    "CATEGORIES",
    "CHANNELS",
    "TRAFFIC_CLASSES",
    "CapConfig",
    "Catalog",
    "LocaleRules",
    "NotificationType",
    "load_catalog",
    "loads_catalog",
]

CATEGORIES = ("transactional", "marketing", "social")
TRAFFIC_CLASSES = ("transactional", "normal", "bulk")
CHANNELS = ("push", "sms", "email", "inapp")
DEFAULT_PATH = Path(__file__).with_name("catalog.toml")
NO_CAP = "none"
_MEMO_LIMIT = 100_000
_FLAGS = (
    "failover_on_unknown",
    "approved",
    "bypass_quiet_hours",
    "bypass_opt_out",
    "allow_unverified_contact",
    "secret",
)


def _next_channels(fallback: Mapping[str, tuple[str, ...]], channel: str) -> tuple[str, ...]:
    steps = (step.split(":", 1)[0] for step in fallback.get(channel, ()))
    return tuple(dict.fromkeys(c for c in steps if c != channel))


def reachable_channels(
    channels: tuple[str, ...], fallback: Mapping[str, tuple[str, ...]]
) -> tuple[str, ...]:
    """`channels`, then every channel reachable through the fallback graph, breadth first."""
    seen = dict.fromkeys(channels)
    queue = list(channels)
    while queue:
        for nxt in _next_channels(fallback, queue.pop(0)):
            if nxt not in seen:
                seen[nxt] = None
                queue.append(nxt)
    return tuple(seen)


@dataclass(frozen=True, slots=True)
class LocaleRules:
    """Per-locale list and number formatting (digest lines)."""

    list_separator: str = ", "
    last_separator: str = " and "
    thousands_separator: str = ","

    def format_int(self, value: int) -> str:
        """`1197` → `1,197` (en), `1.197` (de), `1197` (zh)."""
        return f"{value:,}".replace(",", self.thousands_separator)

    def join(self, items: tuple[str, ...] | list[str], *, last: bool = True) -> str:
        """`a, b and c` (last=True) or `a, b, c` (last=False)."""
        if len(items) < 2 or not last:
            return self.list_separator.join(items)
        return self.list_separator.join(items[:-1]) + self.last_separator + items[-1]


@dataclass(frozen=True, slots=True)
class CapConfig:
    """A frequency-cap bucket: at most `daily_limit` notifications per user per local day."""

    bucket: str
    daily_limit: int


@dataclass(frozen=True, slots=True)
class Escalation:
    """If a message on `from_channel` is not read (READ, OPENED or CLICKED) within `after`,
    send it on `to_channel` too (herald.policy plans the hold, dispatch checks the read)."""

    from_channel: str
    to_channel: str
    after: timedelta


def is_otp_type(name: str) -> bool:
    """One-time-code types are named `otp_*` (the API, plan and the status header agree)."""
    return name.startswith("otp_")


@dataclass(frozen=True, slots=True)
class NotificationType:
    """One catalog entry (immutable). `fallback` maps a channel to steps `channel[:provider]`."""

    name: str
    category: str
    traffic_class: str
    channels: tuple[str, ...]
    fallback: Mapping[str, tuple[str, ...]]
    failover_on_unknown: bool
    approved: bool
    bypass_quiet_hours: bool
    bypass_opt_out: bool
    allow_unverified_contact: bool
    secret: bool  # carries a code or a link that acts for the user: push to verified devices only
    expiry_seconds: int
    default_locale: str | None
    template_version: int
    templates: Mapping[int, TemplateSet]
    digest: DigestConfig | None
    cap: CapConfig | None
    providers: Mapping[str, str]
    allowed_channels: tuple[str, ...] = ()  # primaries, then channels reachable by fallback
    escalation: Escalation | None = None
    # Default TTL of a request without `expire_at` (expiry_seconds; made once, read per user).
    expiry: timedelta = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "expiry", timedelta(seconds=self.expiry_seconds))

    @property
    def transactional(self) -> bool:
        """True for category transactional (never frequency-capped)."""
        return self.category == "transactional"

    @property
    def otp(self) -> bool:
        """One-time codes: limited per phone on every path (`is_otp_type`)."""
        return is_otp_type(self.name)

    def fallback_channels(self, channel: str) -> tuple[str, ...]:
        """Other channels one fallback step away from `channel`, in order."""
        return _next_channels(self.fallback, channel)

    def template_set(self, version: int | None = None) -> TemplateSet:
        """The pinned version, or the current one; raises `UnknownTemplateVersion`."""
        key = self.template_version if version is None else version
        found = self.templates.get(key) if isinstance(key, int) else None
        if found is None:
            raise UnknownTemplateVersion(self.name, version)
        return found


@dataclass(frozen=True, slots=True)
class Catalog:
    """The validated catalog. `memo` is a process-local cache of derived data (locales, render)."""

    version: int
    default_locale: str
    default_timezone: str
    quiet_hours_channels: frozenset[str]
    locales: Mapping[str, LocaleRules]
    types: Mapping[str, NotificationType]
    source: str = "<memory>"
    memo: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)

    def get(self, name: str) -> NotificationType:
        """The type called `name`; raises `UnknownNotificationType`."""
        try:
            return self.types[name]
        except (KeyError, TypeError):
            raise UnknownNotificationType(name) from None

    @property
    def secret_types(self) -> frozenset[str]:
        """The types marked `secret` (their deliveries are sealed, herald/sealing.py)."""
        return frozenset(name for name, nt in self.types.items() if nt.secret)

    def __contains__(self, name: object) -> bool:
        return name in self.types

    def for_event(self, event_type: str) -> NotificationType:
        """The digest type whose `digest.event_type` is `event_type` (like → social_like)."""
        for nt in self.types.values():
            if nt.digest is not None and nt.digest.event_type == event_type:
                return nt
        raise UnknownNotificationType(f"event:{event_type}")

    def locale_chain(self, requested: str | None, nt: NotificationType) -> tuple[str, ...]:
        """The requested tag and its parents, then the type default, then the catalog default."""
        chain = locale_parents(normalize_locale(requested)) if requested else ()
        tail = (nt.default_locale, self.default_locale)
        return tuple(dict.fromkeys([*chain, *(t for t in tail if t)]))

    def resolve_locale(
        self, nt: NotificationType, channel: str, requested: str | None, version: int | None = None
    ) -> str:
        """The first locale of the chain with a template for `channel` (memoized per input)."""
        key = ("locale", nt.name, channel, requested, version)
        hit: str | None = self.memo.get(key)
        if hit is not None:
            return hit
        tset = nt.template_set(version)
        for loc in self.locale_chain(requested, nt):
            if tset.has(channel, loc):
                self.remember(key, loc)
                return loc
        raise NoTemplate(nt.name, channel)

    def locale_rules(self, locale: str) -> LocaleRules:
        """Formatting rules of `locale` or its nearest parent, else of the default locale."""
        for tag in locale_parents(locale):
            if tag in self.locales:
                return self.locales[tag]
        return self.locales.get(self.default_locale, LocaleRules())

    def remember(self, key: Any, value: Any) -> None:
        """Store derived data in `memo` (bounded: cleared when it reaches 100k entries)."""
        if len(self.memo) >= _MEMO_LIMIT:
            self.memo.clear()
        self.memo[key] = value


def load_catalog(path: str | Path | None = None) -> Catalog:
    """Read and validate a catalog file (default `herald/catalog.toml`); raises `ConfigError`."""
    where = Path(path) if path is not None else DEFAULT_PATH
    try:
        text = where.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"catalog {where}: cannot read: {exc}") from exc
    return loads_catalog(text, source=str(where))


def loads_catalog(text: str, source: str = "<memory>") -> Catalog:
    """Parse and validate catalog TOML text; raises `ConfigError`."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"catalog {source}: invalid TOML: {exc}") from exc
    return parse_catalog(raw, source)


# --- parsing and validation --------------------------------------------------------------------


def parse_catalog(raw: Mapping[str, Any], source: str = "<memory>") -> Catalog:
    """Validate a decoded catalog table and build the `Catalog`; raises `ConfigError`."""
    top = Fields(dict(raw), "", source)
    version = top.integer("version", 1)
    default_locale = top.locale("default_locale")
    default_tz: str = top.get("default_timezone", str)
    _check_timezone(default_tz, top)
    quiet = top.strings("quiet_hours_channels", ["push", "sms", "email"])
    if not set(quiet) <= set(CHANNELS):
        raise top.error("quiet_hours_channels", f"must be among {', '.join(CHANNELS)}")
    defaults = top.sub("defaults") if "defaults" in top.raw else Fields({}, "defaults.", source)
    expiry = defaults.integer("expiry_seconds", 1, 86400)
    defaults.close()
    locales = {
        top.locale("locales", tag): _locale_rules(top.sub("locales"), tag)
        for tag in top.get("locales", dict, {})
    }
    caps = {bucket: _cap(top.sub("caps"), bucket) for bucket in top.get("caps", dict, {})}
    types_raw: dict[str, Any] = top.get("types", dict)
    if not types_raw:
        raise top.error("types", "must define at least one notification type")
    ctx = ParseContext(source, default_locale, expiry, caps)
    types = {
        name: _parse_type(Fields(body, f"types.{name}.", source), name, ctx)
        for name, body in types_raw.items()
    }
    top.close()
    _check_event_types(types, top)
    return Catalog(version, default_locale, default_tz, frozenset(quiet), locales, types, source)


def _check_timezone(name: str, f: Fields) -> None:
    try:
        get_zone(name)
    except InvalidTimezone:
        raise f.error("default_timezone", f"{name!r} is not an IANA time zone") from None


def _locale_rules(locales: Fields, tag: str) -> LocaleRules:
    f = locales.sub(tag)
    rules = LocaleRules(
        f.get("list_separator", str, ", "),
        f.get("last_separator", str, " and "),
        f.get("thousands_separator", str, ","),
    )
    f.close()
    return rules


def _cap(caps: Fields, bucket: str) -> CapConfig:
    f = caps.sub(bucket)
    config = CapConfig(bucket, f.integer("daily_limit", 1))
    f.close()
    return config


def _parse_type(f: Fields, name: str, ctx: ParseContext) -> NotificationType:
    category = f.choice("category", CATEGORIES)
    channels = tuple(f.strings("channels"))
    if not channels or not set(channels) <= set(CHANNELS):
        raise f.error("channels", f"must be a non-empty list of {', '.join(CHANNELS)}")
    flags: dict[str, bool] = {key: f.get(key, bool, False) for key in _FLAGS}
    _check_bypass(f, category, flags)
    default_locale = f.locale("default_locale") if "default_locale" in f.raw else None
    fallback = _parse_fallback(f, channels)
    escalation = _parse_escalation(f, channels) if "escalation" in f.raw else None
    reachable = reachable_channels(channels, fallback)
    if escalation is not None and escalation.to_channel not in reachable:
        reachable = (*reachable, escalation.to_channel)
    nt = NotificationType(
        name=name,
        category=category,
        traffic_class=f.choice("traffic_class", TRAFFIC_CLASSES),
        channels=channels,
        fallback=fallback,
        expiry_seconds=f.integer("expiry_seconds", 1, ctx.default_expiry),
        default_locale=default_locale,
        template_version=0,
        templates={},
        digest=parse_digest_config(f.sub("digest"), ctx) if "digest" in f.raw else None,
        cap=_cap_for(f, category, ctx),
        providers=_parse_providers(f),
        allowed_channels=reachable,
        escalation=escalation,
        **flags,
    )
    templates = parse_templates(f.sub("templates"), nt, ctx)
    current = f.integer("template_version", 1, max(templates))
    if current not in templates:
        raise f.error("template_version", f"version {current} is not defined under templates")
    f.close()
    return replace(nt, templates=templates, template_version=current)


def _check_bypass(f: Fields, category: str, flags: dict[str, bool]) -> None:
    if flags["approved"] and category != "transactional":
        raise f.error("approved", "only transactional types can be approved")
    for key in ("bypass_quiet_hours", "bypass_opt_out", "allow_unverified_contact"):
        if flags[key] and not flags["approved"]:
            raise f.error(key, "only approved transactional types (approved = true) may set it")


def _parse_fallback(f: Fields, channels: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    graph: dict[str, tuple[str, ...]] = {}
    for channel, steps in f.get("fallback", dict, {}).items():
        where = f"fallback.{channel}"
        if channel not in CHANNELS:
            raise f.error(where, f"unknown channel {channel!r}")
        if not isinstance(steps, list) or not all(isinstance(s, str) for s in steps):
            raise f.error(where, "must be a list of 'channel' or 'channel:provider' steps")
        for step in steps:
            target, colon, provider = step.partition(":")
            if target not in CHANNELS or (colon and not provider):
                raise f.error(where, f"invalid step {step!r}")
            if target == channel and not provider:
                raise f.error(where, f"step {step!r} falls back to itself")
        graph[channel] = tuple(steps)
    _check_acyclic(f, graph)
    return graph


def _parse_escalation(f: Fields, channels: tuple[str, ...]) -> Escalation:
    """`escalation = { from = "inapp", to = "push", after_seconds = 20 }`."""
    e = f.sub("escalation")
    source, target = e.choice("from", channels), e.choice("to", CHANNELS)
    if target == source:
        raise e.error("to", "escalates to the channel it starts from")
    escalation = Escalation(source, target, timedelta(seconds=e.integer("after_seconds", 1)))
    e.close()
    return escalation


def _check_acyclic(f: Fields, graph: Mapping[str, tuple[str, ...]]) -> None:
    def visit(node: str, path: tuple[str, ...]) -> None:
        for nxt in dict.fromkeys(step.split(":", 1)[0] for step in graph.get(node, ())):
            if nxt == node:
                continue
            if nxt in path:
                raise f.error("fallback", f"cycle {' -> '.join((*path, nxt))}")
            visit(nxt, (*path, nxt))

    for start in graph:
        visit(start, (start,))


def _cap_for(f: Fields, category: str, ctx: ParseContext) -> CapConfig | None:
    bucket = f.get("cap_bucket", str, None)
    if category == "transactional":
        if bucket not in (None, NO_CAP):
            raise f.error("cap_bucket", "transactional types are never frequency-capped")
        return None
    if bucket is None:
        return ctx.caps.get(category)
    if bucket == NO_CAP:
        return None
    if bucket not in ctx.caps:
        raise f.error("cap_bucket", f"unknown bucket {bucket!r} (define [caps.{bucket}])")
    return ctx.caps[bucket]


def _parse_providers(f: Fields) -> dict[str, str]:
    providers: dict[str, Any] = f.get("providers", dict, {})
    for channel, provider in providers.items():
        if channel not in CHANNELS or not isinstance(provider, str) or not provider:
            raise f.error(f"providers.{channel}", "must map a channel to a provider name")
    return dict(providers)


def _check_event_types(types: Mapping[str, NotificationType], top: Fields) -> None:
    owners: dict[str, str] = {}
    for nt in types.values():
        if nt.digest is not None:
            other = owners.setdefault(nt.digest.event_type, nt.name)
            if other != nt.name:
                raise top.error(f"types.{nt.name}.digest.event_type", f"also used by {other}")
