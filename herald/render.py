"""Template rendering: sandboxed Jinja2, compiled once per (type, channel, locale, version).

Templates come from the catalog's `templates` tables (parsed and validated at catalog load by
herald.templates: syntax, allowed fields per channel, every variable a declared param).
Rendering contract:

- `render(catalog, type, channel, locale, version, params) -> Rendered`: `locale` is the wanted
  locale (None = defaults) and goes through the catalog's fallback chain; `version` None = the
  type's current version, else pinned. Errors carry codes: `unknown_notification_type`,
  `unknown_template_version`, `no_template:<channel>`, `invalid_locale`, `missing_param:<name>`,
  `render_failed`.
- Engine: `ImmutableSandboxedEnvironment` with `StrictUndefined` (a typo never renders as "");
  autoescape only for email bodies (HTML); subjects, push, SMS and in-app text are plain.
- Speed: a field without template syntax is a constant, a field made only of `{{ name }}`
  substitutions is rendered by a join (same output as Jinja), anything else by Jinja.
  `CompiledTemplate`s are cached in `catalog.memo`, so nothing is parsed per call.
- Campaigns render once per locale, then fill per-user params: `compiled(...).bind(shared)`
  renders every field that uses only shared params once; `BoundTemplate.render(user_params)`
  renders just the fields that use per-user params (e.g. `first_name`). Per-user params must not
  reuse shared names.
- Digest types get a `summary` variable, the localized digest line built from the params
  `digest_actors` (JSON list of up to `max_actors` display names) and `digest_total`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jinja2 import StrictUndefined, Template, UndefinedError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from markupsafe import escape

from herald.catalog import Catalog, LocaleRules, NotificationType
from herald.catalog_fields import locale_parents
from herald.digest_config import DigestText
from herald.errors import MissingParam, RenderFailed
from herald.templates import template_variables

__all__ = [
    "DIGEST_ACTORS",
    "DIGEST_TOTAL",
    "BoundTemplate",
    "CompiledTemplate",
    "Rendered",
    "compiled",
    "decode_actors",
    "digest_line",
    "encode_actors",
    "render",
]

DIGEST_ACTORS = "digest_actors"
DIGEST_TOTAL = "digest_total"
_PLAIN = ImmutableSandboxedEnvironment(undefined=StrictUndefined, keep_trailing_newline=True)
_HTML = ImmutableSandboxedEnvironment(
    undefined=StrictUndefined, keep_trailing_newline=True, autoescape=True
)
_SIMPLE_VAR = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_JINJA_CONSTANTS = frozenset({"true", "false", "none", "True", "False", "None"})
_UNDEFINED_NAME = re.compile(r"'([^']+)' is undefined")
_NEWLINE = re.compile(r"\r\n|\r|\n")  # Jinja's lexer normalizes template newlines to "\n"


@dataclass(frozen=True, slots=True)
class Rendered:
    """Rendered content (the Delivery's `rendered` record) plus the locale and version used."""

    title: str | None
    body: str
    subject: str | None
    data: Mapping[str, str]
    locale: str
    version: int

    def as_record(self) -> dict[str, Any]:
        """The `RenderedContent` Avro record."""
        return {
            "title": self.title,
            "body": self.body,
            "subject": self.subject,
            "data": dict(self.data),
        }


# --- compiled fields ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Field:
    """One compiled template string: constant, simple substitution, or a Jinja template."""

    variables: frozenset[str]
    literals: tuple[str, ...] | None
    names: tuple[str, ...]
    html: bool
    template: Template | None

    @classmethod
    def compile(cls, source: str, html: bool) -> _Field:
        parts = _SIMPLE_VAR.split(source)
        literals = tuple(_NEWLINE.sub("\n", lit) for lit in parts[0::2])
        names = tuple(parts[1::2])
        simple = not any(tok in lit for lit in literals for tok in ("{{", "{%", "{#"))
        if simple and _JINJA_CONSTANTS.isdisjoint(names):
            return cls(frozenset(names), literals, names, html, None)
        env = _HTML if html else _PLAIN
        return cls(template_variables(source), None, (), html, env.from_string(source))

    def render(self, params: Mapping[str, str]) -> str:
        if self.literals is not None:
            return self._join(params)
        assert self.template is not None
        try:
            return self.template.render(params)
        except UndefinedError as exc:
            found = _UNDEFINED_NAME.search(str(exc))
            raise MissingParam(found.group(1)) if found else RenderFailed(str(exc)) from None
        except Exception as exc:  # sandbox violations, bad filter arguments, ...
            raise RenderFailed(f"{type(exc).__name__}: {exc}") from None

    def _join(self, params: Mapping[str, str]) -> str:
        literals, names = self.literals, self.names
        assert literals is not None
        if not names:
            return literals[0]
        out = [literals[0]]
        for name, literal in zip(names, literals[1:], strict=True):
            value = params.get(name)
            if value is None:
                raise MissingParam(name)
            out.append(str(escape(value)) if self.html else str(value))
            out.append(literal)
        return "".join(out)


@dataclass(frozen=True, slots=True)
class CompiledTemplate:
    """One (type, channel, locale, version) template, compiled; reusable and thread-safe."""

    type_name: str
    channel: str
    locale: str
    version: int
    required: frozenset[str]
    title: _Field | None
    body: _Field
    subject: _Field | None
    data: tuple[tuple[str, _Field], ...]
    summary: _Summary | None

    def render(self, params: Mapping[str, str]) -> Rendered:
        """Render with `params`; raises `MissingParam` / `RenderFailed`."""
        missing = self.required.difference(params)
        if missing:
            raise MissingParam(min(missing))
        ctx = self._context(params)
        return Rendered(
            self.title.render(ctx) if self.title else None,
            self.body.render(ctx),
            self.subject.render(ctx) if self.subject else None,
            {key: f.render(ctx) for key, f in self.data},
            self.locale,
            self.version,
        )

    def bind(self, shared: Mapping[str, str]) -> BoundTemplate:
        """Pre-render every field that only uses `shared` params (campaign: once per locale)."""
        ctx = self._context(shared)
        keys = frozenset(ctx)

        def pre(f: _Field | None) -> str | None:
            return f.render(ctx) if f is not None and f.variables <= keys else None

        fixed = {
            key: pre(f)
            for key, f in (
                ("title", self.title),
                ("body", self.body),
                ("subject", self.subject),
                *self.data,
            )
        }
        return BoundTemplate(self, dict(shared), {k: v for k, v in fixed.items() if v is not None})

    def _summary_ready(self, params: Mapping[str, str]) -> bool:
        return self.summary is not None and DIGEST_ACTORS in params and DIGEST_TOTAL in params

    def _context(self, params: Mapping[str, str]) -> Mapping[str, str]:
        if self.summary is None or "summary" in params or not self._summary_ready(params):
            return params
        actors = decode_actors(params[DIGEST_ACTORS])
        try:
            total = int(params[DIGEST_TOTAL])
        except ValueError:
            raise RenderFailed(f"{DIGEST_TOTAL} must be an integer") from None
        return {**params, "summary": self.summary.line(actors, total)}


@dataclass(frozen=True, slots=True)
class BoundTemplate:
    """A compiled template with the campaign's shared params applied once (see module doc)."""

    compiled: CompiledTemplate
    shared: Mapping[str, str]
    fixed: Mapping[str, str]

    def render(self, user_params: Mapping[str, str] | None = None) -> Rendered:
        """Fill the per-user params; fields that only use shared params are reused as is."""
        c, fixed = self.compiled, self.fixed
        if user_params and not self.shared.keys().isdisjoint(user_params):
            raise ValueError("per-user params must not reuse the names of shared params")
        params = {**self.shared, **user_params} if user_params else self.shared
        missing = c.required.difference(params)
        if missing:
            raise MissingParam(min(missing))
        ctx: Mapping[str, str] | None = None

        def field(key: str, f: _Field | None) -> str | None:
            nonlocal ctx
            if key in fixed or f is None:
                return fixed.get(key)
            ctx = ctx if ctx is not None else c._context(params)
            return f.render(ctx)

        body = field("body", c.body)
        assert body is not None
        data = {key: value for key, f in c.data if (value := field(key, f)) is not None}
        return Rendered(
            field("title", c.title), body, field("subject", c.subject), data, c.locale, c.version
        )


# --- digest lines ------------------------------------------------------------------------------


def encode_actors(names: list[str] | tuple[str, ...]) -> str:
    """The `digest_actors` param: a JSON list of display names."""
    return json.dumps(list(names), ensure_ascii=False, separators=(",", ":"))


def decode_actors(value: str) -> tuple[str, ...]:
    """Inverse of `encode_actors`; raises `RenderFailed` for anything but a list of strings."""
    try:
        names = json.loads(value)
    except ValueError:
        names = None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise RenderFailed(f"{DIGEST_ACTORS} must be a JSON list of strings")
    return tuple(names)


@dataclass(frozen=True, slots=True)
class _Summary:
    """Compiled digest line of one type and locale."""

    few: _Field
    many: _Field
    many_one: _Field | None
    rules: LocaleRules

    def line(self, actors: tuple[str, ...], total: int) -> str:
        total = max(total, len(actors))
        others = total - len(actors)
        fmt = self.rules.format_int
        ctx = {"others": fmt(others), "total": fmt(total)}
        if others == 0:
            return self.few.render({**ctx, "actors": self.rules.join(actors)})
        field = self.many_one if others == 1 and self.many_one is not None else self.many
        return field.render({**ctx, "actors": self.rules.join(actors, last=False)})


def _summary_for(catalog: Catalog, nt: NotificationType, locale: str) -> _Summary | None:
    if nt.digest is None:
        return None
    tail = (nt.default_locale, catalog.default_locale)
    tag = next(t for t in (*locale_parents(locale), *tail) if t and t in nt.digest.texts)
    text: DigestText = nt.digest.texts[tag]
    many_one = _Field.compile(text.many_one, False) if text.many_one else None
    few, many = _Field.compile(text.few, False), _Field.compile(text.many, False)
    return _Summary(few, many, many_one, catalog.locale_rules(tag))


def digest_line(
    catalog: Catalog, type_name: str, locale: str | None, actors: tuple[str, ...], total: int
) -> str:
    """The localized digest line: `user1, user2, user3 and 1,197 others liked your post`."""
    nt = catalog.get(type_name)
    tag = catalog.locale_chain(locale, nt)[0] if locale else catalog.default_locale
    key = ("summary", type_name, tag)
    summary = catalog.memo.get(key)
    if summary is None:
        summary = _summary_for(catalog, nt, tag)
        if summary is None:
            raise RenderFailed(f"{type_name} has no digest configuration")
        catalog.remember(key, summary)
    return str(summary.line(actors, total))


# --- lookup and the public entry points --------------------------------------------------------


def compiled(
    catalog: Catalog, type_name: str, channel: str, locale: str | None, version: int | None = None
) -> CompiledTemplate:
    """The cached compiled template after locale fallback; raises `TemplateError` subclasses."""
    key = ("compiled", type_name, channel, locale, version)
    hit: CompiledTemplate | None = catalog.memo.get(key)
    if hit is not None:
        return hit
    nt = catalog.get(type_name)
    tset = nt.template_set(version)
    resolved = catalog.resolve_locale(nt, channel, locale, version)
    src = tset.sources[(channel, resolved)]
    html = channel == "email"
    result = CompiledTemplate(
        type_name=type_name,
        channel=channel,
        locale=resolved,
        version=tset.version,
        required=tset.params,
        title=_Field.compile(src.title, False) if src.title is not None else None,
        body=_Field.compile(src.body, html),
        subject=_Field.compile(src.subject, False) if src.subject is not None else None,
        data=tuple((k, _Field.compile(v, False)) for k, v in src.data),
        summary=_summary_for(catalog, nt, resolved) if "summary" in src.variables else None,
    )
    catalog.remember(key, result)
    return result


def render(
    catalog: Catalog,
    type_name: str,
    channel: str,
    locale: str | None,
    version: int | None,
    params: Mapping[str, str],
) -> Rendered:
    """Render one delivery's content (see the module docstring for the contract)."""
    return compiled(catalog, type_name, channel, locale, version).render(params)
