"""The notification-type catalog: the shipped file, lookups, locale fallback and validation."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from herald.catalog import Catalog, load_catalog, loads_catalog, parse_catalog
from herald.catalog_fields import normalize_locale
from herald.errors import (
    CatalogLookupError,
    ConfigError,
    InvalidLocale,
    NoTemplate,
    UnknownNotificationType,
    UnknownTemplateVersion,
)


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


# --- the shipped catalog -----------------------------------------------------------------------


def test_shipped_catalog_loads_with_every_type(catalog: Catalog) -> None:
    assert catalog.version >= 1
    assert catalog.default_locale == "en"
    assert catalog.default_timezone == "UTC"
    for name in [
        "otp_login",
        "password_reset",
        "payment_result",
        "security_alert",
        "order_shipped",
        "social_like",
        "social_comment",
        "social_follow",
        "qa_invite",
        "marketing_campaign",
        "promo_weekly",
        "inbox_announcement",
    ]:
        assert name in catalog
        assert catalog.get(name).name == name


def test_otp_login(catalog: Catalog) -> None:
    otp = catalog.get("otp_login")
    assert (otp.category, otp.traffic_class) == ("transactional", "transactional")
    assert otp.channels == ("sms",)
    assert otp.fallback["sms"] == ("sms:sms_b", "push")
    assert otp.fallback_channels("sms") == ("push",)
    assert otp.allowed_channels == ("sms", "push")
    assert otp.bypass_quiet_hours and otp.bypass_opt_out and otp.approved
    assert not otp.failover_on_unknown
    assert otp.expiry_seconds == 300
    assert otp.cap is None
    assert otp.template_version == 2 and set(otp.templates) == {1, 2}
    assert otp.template_set().params == {"code"}


def test_classes_categories_and_caps(catalog: Catalog) -> None:
    shipped = catalog.get("order_shipped")
    assert (shipped.category, shipped.traffic_class) == ("transactional", "normal")
    assert not shipped.bypass_quiet_hours and not shipped.bypass_opt_out
    campaign = catalog.get("marketing_campaign")
    assert (campaign.category, campaign.traffic_class) == ("marketing", "bulk")
    assert campaign.cap is not None and campaign.cap.daily_limit == 3
    assert campaign.cap.bucket == "marketing"
    assert catalog.get("promo_weekly").cap == campaign.cap
    assert catalog.get("inbox_announcement").cap is None
    assert catalog.get("security_alert").failover_on_unknown


def test_digest_windows(catalog: Catalog) -> None:
    windows = {
        name: catalog.get(name).digest.window_seconds  # type: ignore[union-attr]
        for name in ("social_like", "social_comment", "social_follow", "qa_invite")
    }
    assert windows == {
        "social_like": 600,
        "social_comment": 30,
        "social_follow": 300,
        "qa_invite": 0,
    }
    assert catalog.for_event("like").name == "social_like"
    assert catalog.for_event("qa_invite").name == "qa_invite"
    with pytest.raises(UnknownNotificationType):
        catalog.for_event("poke")


def test_unknown_type_has_a_code(catalog: Catalog) -> None:
    with pytest.raises(UnknownNotificationType) as exc:
        catalog.get("critical_override")
    assert exc.value.code == "unknown_notification_type"
    assert isinstance(exc.value, CatalogLookupError)


def test_unknown_template_version(catalog: Catalog) -> None:
    with pytest.raises(UnknownTemplateVersion) as exc:
        catalog.get("otp_login").template_set(7)
    assert exc.value.code == "unknown_template_version"


# --- locales -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "normalized"),
    [
        ("en", "en"),
        ("pt_br", "pt-BR"),
        ("PT-br", "pt-BR"),
        ("zh-hans-cn", "zh-Hans-CN"),
        ("es-419", "es-419"),
        ("de-CH", "de-CH"),
    ],
)
def test_normalize_locale(raw: str, normalized: str) -> None:
    assert normalize_locale(raw) == normalized


@pytest.mark.parametrize("bad", ["", "e", "english!", "en--US", "12", "en US"])
def test_invalid_locale(bad: str) -> None:
    with pytest.raises(InvalidLocale) as exc:
        normalize_locale(bad)
    assert exc.value.code == "invalid_locale"


def test_locale_fallback_chain(catalog: Catalog) -> None:
    otp = catalog.get("otp_login")
    assert catalog.locale_chain("pt-BR", otp) == ("pt-BR", "pt", "en")
    assert catalog.locale_chain(None, otp) == ("en",)
    assert catalog.resolve_locale(otp, "sms", "pt-BR") == "en"
    assert catalog.resolve_locale(otp, "sms", "de-CH") == "de"
    assert catalog.resolve_locale(otp, "sms", "zh-Hans-CN") == "zh"
    # Version 1 has no German SMS text: the chain ends at the catalog default.
    assert catalog.resolve_locale(otp, "sms", "de-CH", version=1) == "en"


def test_channel_without_template(catalog: Catalog) -> None:
    with pytest.raises(NoTemplate) as exc:
        catalog.resolve_locale(catalog.get("otp_login"), "email", "en")
    assert exc.value.code == "no_template:email"


def test_locale_rules(catalog: Catalog) -> None:
    assert catalog.locale_rules("en-GB").format_int(1197) == "1,197"
    assert catalog.locale_rules("de").format_int(1197) == "1.197"
    assert catalog.locale_rules("zh-CN").format_int(1200) == "1200"
    assert catalog.locale_rules("en").join(["a", "b", "c"]) == "a, b and c"
    assert catalog.locale_rules("zh").join(["a", "b", "c"]) == "a、b、c"
    assert catalog.locale_rules("fr").join(["a", "b"]) == "a and b"  # default locale's rules


# --- validation --------------------------------------------------------------------------------

BASE: dict[str, Any] = {
    "version": 3,
    "default_locale": "en",
    "default_timezone": "UTC",
    "caps": {"marketing": {"daily_limit": 3}},
    "types": {
        "t": {
            "category": "transactional",
            "traffic_class": "transactional",
            "channels": ["sms"],
            "templates": {"1": {"params": ["code"], "sms": {"en": {"body": "{{ code }}"}}}},
        }
    },
}


def build(**changes: Any) -> dict[str, Any]:
    raw = copy.deepcopy(BASE)
    raw["types"]["t"].update(changes)
    return raw


def rejects(raw: dict[str, Any], *fragments: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_catalog(raw)
    for fragment in fragments:
        assert fragment in str(exc.value), str(exc.value)


def test_minimal_catalog_is_valid() -> None:
    cat = parse_catalog(build())
    assert cat.version == 3
    assert cat.get("t").expiry_seconds == 86400


@pytest.mark.parametrize(
    "flag", ["bypass_quiet_hours", "bypass_opt_out", "allow_unverified_contact"]
)
def test_bypass_requires_approval(flag: str) -> None:
    rejects(build(**{flag: True}), f"types.t.{flag}", "approved")
    assert getattr(parse_catalog(build(**{flag: True, "approved": True})).get("t"), flag)


def test_bypass_requires_transactional_category() -> None:
    rejects(
        build(category="marketing", traffic_class="bulk", approved=True, bypass_quiet_hours=True),
        "types.t.approved",
        "transactional",
    )


@pytest.mark.parametrize(
    ("changes", "fragments"),
    [
        ({"category": "critical"}, ["types.t.category", "transactional, marketing, social"]),
        ({"traffic_class": "urgent"}, ["types.t.traffic_class"]),
        ({"channels": []}, ["types.t.channels"]),
        ({"channels": ["fax"]}, ["types.t.channels"]),
        ({"expiry_seconds": 0}, ["types.t.expiry_seconds", ">= 1"]),
        ({"expiry_seconds": True}, ["types.t.expiry_seconds", "int"]),
        ({"expirey_seconds": 10}, ["types.t.expirey_seconds", "unknown field"]),
        ({"fallback": {"sms": ["fax"]}}, ["types.t.fallback.sms", "invalid step"]),
        ({"fallback": {"sms": ["sms"]}}, ["types.t.fallback.sms", "itself"]),
        ({"fallback": {"sms": ["push"], "push": ["sms"]}}, ["types.t.fallback", "cycle"]),
        ({"cap_bucket": "marketing"}, ["types.t.cap_bucket", "never frequency-capped"]),
        ({"template_version": 2}, ["types.t.template_version", "not defined"]),
        ({"default_locale": "??"}, ["types.t.default_locale"]),
        ({"providers": {"sms": 3}}, ["types.t.providers.sms"]),
    ],
)
def test_type_field_errors_name_type_and_field(
    changes: dict[str, Any], fragments: list[str]
) -> None:
    rejects(build(**changes), *fragments)


def test_unknown_cap_bucket() -> None:
    rejects(
        build(category="marketing", traffic_class="bulk", cap_bucket="promo"),
        "types.t.cap_bucket",
        "promo",
    )


def test_marketing_types_get_the_category_bucket_by_default() -> None:
    cat = parse_catalog(build(category="marketing", traffic_class="bulk"))
    assert cat.get("t").cap is not None
    none = parse_catalog(build(category="marketing", traffic_class="bulk", cap_bucket="none"))
    assert none.get("t").cap is None


@pytest.mark.parametrize(
    ("templates", "fragments"),
    [
        (
            {"1": {"params": ["code"], "sms": {"de": {"body": "{{ code }}"}}}},
            ["types.t.templates.1.sms", "needs a template in en"],
        ),
        (
            {"1": {"params": [], "sms": {"en": {"body": "{{ code }}"}}}},
            ["types.t.templates.1.sms.en.body", "undeclared parameter 'code'"],
        ),
        (
            {"1": {"params": ["code"], "sms": {"en": {"body": "{{ code "}}}},
            ["types.t.templates.1.sms.en.body", "syntax"],
        ),
        (
            {"1": {"params": ["code"], "sms": {"en": {"body": "x", "title": "y"}}}},
            ["types.t.templates.1.sms.en.title", "not a field of sms"],
        ),
        (
            {
                "1": {
                    "params": ["code"],
                    "sms": {"en": {"body": "x"}},
                    "email": {"en": {"subject": "s", "body": "b"}},
                }
            },
            ["types.t.templates.1.email", "does not use channel"],
        ),
        ({"x": {"sms": {"en": {"body": "x"}}}}, ["types.t.templates.x", "integers"]),
        (
            {"1": {"sms": {"en": {"body": "x", "data": {"k": 1}}}}},
            ["types.t.templates.1.sms.en.data"],
        ),
        ({}, ["types.t.templates", "at least one version"]),
    ],
)
def test_template_errors(templates: dict[str, Any], fragments: list[str]) -> None:
    rejects(build(templates=templates), *fragments)


def test_email_requires_subject() -> None:
    raw = build(channels=["email"], templates={"1": {"email": {"en": {"body": "<p>x</p>"}}}})
    rejects(raw, "types.t.templates.1.email.en.subject", "required")


def test_fallback_channels_need_templates() -> None:
    rejects(build(fallback={"sms": ["push"]}), "types.t.templates.1.push")


def test_catalog_level_errors() -> None:
    for key, value, fragment in [
        ("version", 0, "version"),
        ("default_timezone", "Mars/Base", "default_timezone"),
        ("default_timezone", "localtime", "default_timezone"),
        ("default_locale", "!!", "default_locale"),
        ("quiet_hours_channels", ["fax"], "quiet_hours_channels"),
        ("surprise", 1, "surprise"),
    ]:
        raw = copy.deepcopy(BASE)
        raw[key] = value
        rejects(raw, fragment)
    raw = copy.deepcopy(BASE)
    del raw["version"]
    rejects(raw, "version: is required")


def test_digest_validation() -> None:
    digest = {
        "event_type": "like",
        "window_seconds": 60,
        "text": {"de": {"few": "{{ actors }}", "many": "{{ actors }} {{ others }}"}},
    }
    raw = build(category="social", traffic_class="normal", digest=digest)
    rejects(raw, "types.t.digest.text", "default locale")
    digest["text"] = {"en": {"few": "{{ actors }}", "many": "{{ actor }}"}}
    rejects(raw, "types.t.digest.text.en.many", "undeclared parameter 'actor'")
    digest["text"] = {"en": {"few": "{{ actors }}", "many": "{{ actors }}"}}
    digest["window_seconds"] = -1
    rejects(raw, "types.t.digest.window_seconds")


def test_duplicate_digest_event_types() -> None:
    digest = {
        "event_type": "like",
        "window_seconds": 60,
        "text": {"en": {"few": "{{ actors }}", "many": "{{ actors }}"}},
    }
    raw = build(category="social", traffic_class="normal", digest=digest)
    raw["types"]["u"] = copy.deepcopy(raw["types"]["t"])
    rejects(raw, "digest.event_type", "also used by")


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_catalog(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="invalid TOML"):
        loads_catalog("version = ")
    bad = tmp_path / "catalog.toml"
    bad.write_text('version = 1\ndefault_locale = "en"\ndefault_timezone = "UTC"\n[types]\n')
    with pytest.raises(ConfigError, match="at least one notification type"):
        load_catalog(bad)
