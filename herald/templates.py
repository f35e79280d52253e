"""The catalog's templates: their sources per (version, channel, locale), and their parser.

    parse_templates(fields, type, ctx)   types.<name>.templates → {version: TemplateSet}
                                         (syntax, allowed fields per channel, every variable a
                                         declared param); called by herald.catalog at load
    check_variables(fields, key, text, allowed)   a text's variables, each one allowed
    template_variables(text)             the names a template reads

Rendering them is herald.render's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol

from jinja2 import StrictUndefined, TemplateSyntaxError, meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

from herald.catalog_fields import Fields, ParseContext

__all__ = [
    "TemplateSet",
    "TemplateSource",
    "TemplateSyntaxError",
    "TypeShape",
    "check_variables",
    "parse_templates",
    "template_variables",
]

_PARSER = ImmutableSandboxedEnvironment(undefined=StrictUndefined, keep_trailing_newline=True)
_CHANNEL_FIELDS = {
    "push": {"title", "body", "data"},
    "inapp": {"title", "body", "data"},
    "sms": {"body", "data"},
    "email": {"subject", "body", "data"},
}


class TypeShape(Protocol):
    """What the parser reads of the notification type whose templates it parses
    (herald.catalog.NotificationType)."""

    @property
    def name(self) -> str: ...
    @property
    def default_locale(self) -> str | None: ...
    @property
    def allowed_channels(self) -> tuple[str, ...]: ...
    @property
    def digest(self) -> Any: ...


@dataclass(frozen=True, slots=True)
class TemplateSource:
    """Source text of one (version, channel, locale) template; `variables` = names it uses."""

    channel: str
    locale: str
    title: str | None
    body: str
    subject: str | None
    data: tuple[tuple[str, str], ...]
    variables: frozenset[str]


@dataclass(frozen=True, slots=True)
class TemplateSet:
    """All templates of one version: `params` are required, `optional_params` may be absent."""

    version: int
    params: frozenset[str]
    optional_params: frozenset[str]
    sources: Mapping[tuple[str, str], TemplateSource]

    def has(self, channel: str, locale: str) -> bool:
        """True when a template exists for exactly this channel and locale."""
        return (channel, locale) in self.sources


@lru_cache(maxsize=8192)
def template_variables(source: str) -> frozenset[str]:
    """Names a template reads; raises `TemplateSyntaxError` for invalid syntax."""
    return frozenset(meta.find_undeclared_variables(_PARSER.parse(source)))


def parse_templates(f: Fields, nt: TypeShape, ctx: ParseContext) -> dict[int, TemplateSet]:
    """Parse and validate the `templates` table of one type (called by `herald.catalog`)."""
    if not f.raw:
        raise f.error("", "must define at least one version (templates.1)")
    sets: dict[int, TemplateSet] = {}
    for key in f.raw:
        if not key.isdigit() or int(key) < 1:
            raise f.error(key, "template versions are integers >= 1")
        tset = _parse_set(int(key), f.sub(key), nt)
        terminal = [loc for loc in (nt.default_locale, ctx.default_locale) if loc]
        for channel in nt.allowed_channels:
            if not any(tset.has(channel, loc) for loc in terminal):
                raise f.error(f"{key}.{channel}", f"needs a template in {' or '.join(terminal)}")
        sets[int(key)] = tset
    f.close()
    return sets


def _parse_set(version: int, f: Fields, nt: TypeShape) -> TemplateSet:
    params = frozenset(f.strings("params", []))
    optional = frozenset(f.strings("optional_params", []))
    allowed = params | optional | ({"summary"} if nt.digest else frozenset())
    sources: dict[tuple[str, str], TemplateSource] = {}
    for channel in [k for k in f.raw if k not in ("params", "optional_params")]:
        if channel not in nt.allowed_channels:
            raise f.error(channel, f"{nt.name} does not use channel {channel!r}")
        per_locale = f.sub(channel)
        for tag in per_locale.raw:
            locale = per_locale.locale(tag, tag)
            sources[(channel, locale)] = _parse_source(
                channel, locale, per_locale.sub(tag), allowed
            )
        per_locale.close()
    f.close()
    return TemplateSet(version, params, optional, sources)


def _parse_source(channel: str, locale: str, f: Fields, allowed: frozenset[str]) -> TemplateSource:
    unknown = sorted(set(f.raw) - _CHANNEL_FIELDS[channel])
    if unknown:
        raise f.error(unknown[0], f"not a field of {channel} templates")
    data: dict[str, Any] = f.get("data", dict, {})
    if not all(isinstance(v, str) for v in data.values()):
        raise f.error("data", "values must be strings (templates)")
    title = f.get("title", str, None)
    body: str = f.get("body", str)
    subject = f.get("subject", str) if channel == "email" else None
    used: set[str] = set()
    for key, text in [
        ("title", title),
        ("body", body),
        ("subject", subject),
        *((f"data.{k}", v) for k, v in data.items()),
    ]:
        if text is not None:
            used |= check_variables(f, key, text, allowed)
    f.close()
    return TemplateSource(
        channel, locale, title, body, subject, tuple(sorted(data.items())), frozenset(used)
    )


def check_variables(f: Fields, key: str, text: str, allowed: frozenset[str]) -> frozenset[str]:
    """The variables of `text`; `ConfigError` on bad syntax or a variable not in `allowed`."""
    try:
        used = template_variables(text)
    except TemplateSyntaxError as exc:
        raise f.error(key, f"template syntax error: {exc}") from None
    undeclared = sorted(used - allowed)
    if undeclared:
        raise f.error(key, f"uses undeclared parameter {undeclared[0]!r} (declare it in params)")
    return used
