"""Template rendering: locale fallback, pinned versions, error codes, escaping, campaigns."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jinja2 import StrictUndefined
from jinja2.sandbox import ImmutableSandboxedEnvironment

from herald.catalog import Catalog, load_catalog, parse_catalog
from herald.errors import (
    CatalogLookupError,
    InvalidLocale,
    MissingParam,
    NoTemplate,
    RenderFailed,
    UnknownNotificationType,
    UnknownTemplateVersion,
)
from herald.render import (
    _Field,
    compiled,
    decode_actors,
    digest_line,
    encode_actors,
    render,
)
from tests.herald.test_catalog import BASE


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


OTP = {"code": "493817"}


def test_render_current_version_with_locale_fallback(catalog: Catalog) -> None:
    out = render(catalog, "otp_login", "sms", "pt-BR", None, OTP)
    assert out.body.startswith("Herald: your login code is 493817.")
    assert (out.locale, out.version, out.title, out.subject) == ("en", 2, None, None)
    de = render(catalog, "otp_login", "sms", "de-CH", None, {**OTP, "app_name": "Shop"})
    assert de.body.startswith("Shop: Ihr Anmeldecode lautet 493817.")
    assert de.locale == "de"


def test_pinned_version(catalog: Catalog) -> None:
    v1 = render(catalog, "otp_login", "sms", "zh-CN", 1, OTP)
    assert (v1.body, v1.locale, v1.version) == ("您的登录验证码是 493817", "zh", 1)
    # v1 has no German text: falls back to the catalog default.
    assert render(catalog, "otp_login", "sms", "de", 1, OTP).locale == "en"


def test_push_title_body_and_data(catalog: Catalog) -> None:
    out = render(
        catalog, "order_shipped", "push", "en", None, {"order_id": "A-1", "carrier": "DHL"}
    )
    assert out.title == "Your order has shipped"
    assert out.body == "Order A-1 is on its way with DHL."
    assert out.data == {"deep_link": "app://orders/A-1"}
    assert out.as_record() == {
        "title": out.title,
        "body": out.body,
        "subject": None,
        "data": {"deep_link": "app://orders/A-1"},
    }
    no_carrier = render(catalog, "order_shipped", "push", "en", None, {"order_id": "A-1"})
    assert no_carrier.body == "Order A-1 is on its way."


def test_autoescape_only_for_email_bodies(catalog: Catalog) -> None:
    event = "<b>login</b> & more"
    email = render(catalog, "security_alert", "email", "en", None, {"event": event})
    assert "&lt;b&gt;login&lt;/b&gt; &amp; more" in email.body
    assert email.subject == f"Security alert: {event}"
    push = render(catalog, "security_alert", "push", "en", None, {"event": event})
    assert push.body.startswith(event)
    reset = render(
        catalog,
        "password_reset",
        "email",
        "en",
        None,
        {"reset_url": "https://x.test/r?a=1&b=2", "name": "Ann"},
    )
    assert 'href="https://x.test/r?a=1&amp;b=2"' in reset.body and "Hi Ann," in reset.body


@pytest.mark.parametrize(
    ("call", "exc", "code"),
    [
        (("nope", "sms", "en", None, OTP), UnknownNotificationType, "unknown_notification_type"),
        (("otp_login", "sms", "en", 9, OTP), UnknownTemplateVersion, "unknown_template_version"),
        (("otp_login", "email", "en", None, OTP), NoTemplate, "no_template:email"),
        (("otp_login", "sms", "en US!", None, OTP), InvalidLocale, "invalid_locale"),
        (("otp_login", "sms", "en", None, {}), MissingParam, "missing_param:code"),
        (
            (
                "payment_result",
                "push",
                "en",
                None,
                {"amount": "1", "currency": "EUR", "status": "ok"},
            ),
            MissingParam,
            "missing_param:order_id",
        ),
    ],
)
def test_errors_have_machine_codes(
    catalog: Catalog, call: tuple[Any, ...], exc: type[CatalogLookupError], code: str
) -> None:
    with pytest.raises(exc) as info:
        render(catalog, *call)
    assert info.value.code == code


def test_compiled_templates_are_cached(catalog: Catalog) -> None:
    a = compiled(catalog, "otp_login", "sms", "zh", None)
    assert a is compiled(catalog, "otp_login", "sms", "zh", None)
    assert a.locale == "zh" and a.required == {"code"}


def custom_catalog(body: str, params: list[str]) -> Catalog:
    raw = copy.deepcopy(BASE)
    raw["types"]["t"]["templates"] = {"1": {"params": params, "sms": {"en": {"body": body}}}}
    return parse_catalog(raw)


def test_sandbox_blocks_attribute_escapes() -> None:
    cat = custom_catalog("{{ code.__class__.__mro__ }}", ["code"])
    with pytest.raises(RenderFailed) as info:
        render(cat, "t", "sms", "en", None, {"code": "x"})
    assert info.value.code == "render_failed"


def test_optional_param_used_without_guard_is_a_missing_param() -> None:
    raw = copy.deepcopy(BASE)
    raw["types"]["t"]["templates"] = {
        "1": {
            "params": [],
            "optional_params": ["name"],
            "sms": {"en": {"body": "Hi {{ name|upper }}"}},
        }
    }
    with pytest.raises(MissingParam) as info:
        render(parse_catalog(raw), "t", "sms", "en", None, {})
    assert info.value.code == "missing_param:name"


# --- the fast path is Jinja --------------------------------------------------------------------

_PLAIN = ImmutableSandboxedEnvironment(undefined=StrictUndefined, keep_trailing_newline=True)
_HTML = ImmutableSandboxedEnvironment(
    undefined=StrictUndefined, keep_trailing_newline=True, autoescape=True
)


def test_simple_templates_take_the_fast_path() -> None:
    assert _Field.compile("Your code is {{ code }}", False).template is None
    assert _Field.compile("static", False).template is None
    assert _Field.compile("{{ code|upper }}", False).template is not None
    assert _Field.compile("{% if x %}y{% endif %}", False).template is not None
    assert _Field.compile("{{ true }}", False).template is not None


@settings(max_examples=200, deadline=None)
@given(
    prefix=st.text(max_size=10).filter(lambda s: "{" not in s and "}" not in s),
    value=st.text(max_size=20),
    html=st.booleans(),
)
def test_fast_path_matches_jinja(prefix: str, value: str, html: bool) -> None:
    source = f"{prefix}{{{{ a }}}}-{{{{b}}}}\n"
    fast = _Field.compile(source, html)
    assert fast.template is None
    env = _HTML if html else _PLAIN
    params = {"a": value, "b": value[::-1]}
    assert fast.render(params) == env.from_string(source).render(params)


# --- campaigns: render once per locale, fill per-user params -----------------------------------

SHARED = {
    "headline": "Autumn sale",
    "offer": "30% off <everything>",
    "cta_url": "https://s.test/a?x=1&y=2",
}


def test_bound_template_prerenders_shared_fields(catalog: Catalog) -> None:
    bound = compiled(catalog, "marketing_campaign", "email", "en", None).bind(SHARED)
    assert set(bound.fixed) == {"subject"}  # the body also uses first_name
    push = compiled(catalog, "marketing_campaign", "push", "en", None).bind(SHARED)
    assert set(push.fixed) == {"title", "deep_link"}
    for user in ({"first_name": "Ann"}, {}, {"first_name": "<Bob>"}):
        for bound_t, channel in ((bound, "email"), (push, "push")):
            expected = render(
                catalog, "marketing_campaign", channel, "en", None, {**SHARED, **user}
            )
            assert bound_t.render(user) == expected


def test_bound_template_output(catalog: Catalog) -> None:
    bound = compiled(catalog, "marketing_campaign", "email", "zh-CN", None).bind(SHARED)
    out = bound.render({"first_name": "小明"})
    assert out.locale == "zh" and out.subject == "Autumn sale"
    assert "小明，30% off &lt;everything&gt;" in out.body


def test_bound_template_errors(catalog: Catalog) -> None:
    bound = compiled(catalog, "marketing_campaign", "push", "en", None).bind(SHARED)
    with pytest.raises(ValueError, match="shared"):
        bound.render({"headline": "override"})
    partial = compiled(catalog, "marketing_campaign", "push", "en", None).bind({"headline": "h"})
    with pytest.raises(MissingParam) as info:
        partial.render({"first_name": "Ann"})
    assert info.value.code == "missing_param:cta_url"


# --- digest lines ------------------------------------------------------------------------------


def digest_params(names: list[str], total: int) -> dict[str, str]:
    return {"digest_actors": encode_actors(names), "digest_total": str(total)}


@pytest.mark.parametrize(
    ("locale", "names", "total", "expected"),
    [
        (
            "en",
            ["user1", "user2", "user3"],
            1200,
            "user1, user2, user3 and 1,197 others liked your post",
        ),
        ("zh", ["user1", "user2", "user3"], 1200, "user1、user2、user3 等 1200 人赞了你"),
        ("de", ["a", "b", "c"], 1200, "a, b, c und 1.197 weiteren gefällt dein Beitrag"),
        ("en", ["a", "b", "c"], 4, "a, b, c and 1 other liked your post"),
        ("en", ["a", "b"], 2, "a and b liked your post"),
        ("en", ["a"], 1, "a liked your post"),
        ("fr", ["a"], 1, "a liked your post"),
    ],
)
def test_digest_summary_in_templates(
    catalog: Catalog, locale: str, names: list[str], total: int, expected: str
) -> None:
    out = render(catalog, "social_like", "push", locale, None, digest_params(names, total))
    assert out.body == expected
    assert digest_line(catalog, "social_like", locale, tuple(names), total) == expected


def test_digest_params_are_validated(catalog: Catalog) -> None:
    with pytest.raises(RenderFailed):
        render(
            catalog,
            "social_like",
            "push",
            "en",
            None,
            {"digest_actors": "not json", "digest_total": "3"},
        )
    with pytest.raises(RenderFailed):
        render(
            catalog,
            "social_like",
            "push",
            "en",
            None,
            {"digest_actors": "[]", "digest_total": "many"},
        )
    assert decode_actors(encode_actors(["user,1", "用户"])) == ("user,1", "用户")
    with pytest.raises(RenderFailed):
        digest_line(catalog, "otp_login", "en", ("a",), 1)


def test_every_shipped_fast_path_template_matches_jinja(catalog: Catalog) -> None:
    for nt in catalog.types.values():
        for tset in nt.templates.values():
            for src in tset.sources.values():
                html = src.channel == "email"
                fields = [
                    (src.body, html),
                    (src.title, False),
                    (src.subject, False),
                    *((v, False) for _, v in src.data),
                ]
                for text, escaped in fields:
                    if text is None:
                        continue
                    compiled_field = _Field.compile(text, escaped)
                    if compiled_field.template is not None:
                        continue
                    params = {name: f"<{name}&'\">" for name in compiled_field.names}
                    env = _HTML if escaped else _PLAIN
                    assert compiled_field.render(params) == env.from_string(text).render(params)


def test_every_shipped_template_renders(catalog: Catalog) -> None:
    for nt in catalog.types.values():
        for version, tset in nt.templates.items():
            params = {name: f"v-{name}" for name in tset.params | tset.optional_params}
            if nt.digest is not None:
                params.update({"digest_actors": encode_actors(["a", "b"]), "digest_total": "7"})
            for channel, locale in tset.sources:
                out = render(catalog, nt.name, channel, locale, version, params)
                assert out.body and out.locale == locale and out.version == version
                assert (out.subject is not None) == (channel == "email")
                minimal = {k: v for k, v in params.items() if k not in tset.optional_params}
                assert render(catalog, nt.name, channel, locale, version, minimal).body
