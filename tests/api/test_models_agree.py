"""The HTTP API models agree with the Avro contracts they map onto.

1. Every API field has a same-named Avro field (or one stated in `AVRO_MAPPING`) of a compatible
   type: str/Literal -> string, int -> int|long, bool -> boolean, datetime -> timestamp-millis,
   list -> array, dict -> map, nested model -> record (checked recursively); an optional API
   field needs a nullable Avro field or one with a default.
2. Records built from API models by the conversion functions encode and decode round-trip.
"""

from __future__ import annotations

import json
import types
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import pytest
from pydantic import AwareDatetime, BaseModel, ValidationError

import schemas
from api.models import (
    AVRO_MAPPING,
    ContactPointsUpdate,
    DeviceRegistration,
    NotificationCreate,
    PreferencesIn,
    empty_contact_points,
    preferences_from_record,
    to_preferences_record,
    to_request_record,
    with_contact_update,
    with_device,
)
from herald.user_records import empty_preferences, without_device
from schemas.registry import FileRegistry
from schemas.serde import AvroDeserializer, AvroSerializer

T0 = datetime(2026, 3, 29, 0, 59, 59, 250000, tzinfo=UTC)

# -- 1. field agreement -------------------------------------------------------------------------

Shape = Any  # "string" | ("array", Shape) | ("map", Shape) | ("record", x) | ("nullable", Shape)


def _api_shape(tp: Any) -> Shape:
    origin = get_origin(tp)
    if origin is Annotated:
        return _api_shape(get_args(tp)[0])
    if origin in (Union, types.UnionType):
        rest = [a for a in get_args(tp) if a is not type(None)]
        assert len(rest) == 1, f"unsupported union {tp}"
        return ("nullable", _api_shape(rest[0]))
    if origin is Literal:
        assert all(isinstance(v, str) for v in get_args(tp))
        return "string"
    if origin is list:
        return ("array", _api_shape(get_args(tp)[0]))
    if origin is dict:
        assert _api_shape(get_args(tp)[0]) == "string", "map keys are strings in Avro"
        return ("map", _api_shape(get_args(tp)[1]))
    if tp is AwareDatetime or tp is datetime:
        return "timestamp-millis"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return ("record", tp)
    return {str: "string", int: "int", bool: "boolean"}[tp]


def _avro_shape(schema: Any) -> Shape:
    if isinstance(schema, list):
        rest = [s for s in schema if s != "null"]
        assert len(rest) == 1
        inner = _avro_shape(rest[0])
        return ("nullable", inner) if "null" in schema else inner
    if isinstance(schema, dict):
        if "logicalType" in schema:
            return schema["logicalType"]
        kind = schema["type"]
        if kind == "record":
            return ("record", schema)
        if kind == "array":
            return ("array", _avro_shape(schema["items"]))
        if kind == "map":
            return ("map", _avro_shape(schema["values"]))
        return _avro_shape(kind)
    return schema


def _fits(api: Shape, avro: Shape, has_default: bool, where: str) -> None:
    if isinstance(api, tuple) and api[0] == "nullable":
        if isinstance(avro, tuple) and avro[0] == "nullable":
            avro = avro[1]
        else:
            assert has_default, f"{where}: optional in the API, neither nullable nor defaulted"
        api = api[1]
    elif isinstance(avro, tuple) and avro[0] == "nullable":
        avro = avro[1]  # the API is stricter than the contract: fine
    if api == "int":
        assert avro in ("int", "long"), f"{where}: int vs {avro}"
    elif isinstance(api, tuple) and api[0] == "record":
        assert isinstance(avro, tuple) and avro[0] == "record", f"{where}: record vs {avro}"
        _check_model(api[1], avro[1], None, where)
    elif isinstance(api, tuple):
        assert isinstance(avro, tuple) and avro[0] == api[0], f"{where}: {api} vs {avro}"
        _fits(api[1], avro[1], False, f"{where}[]")
    else:
        assert api == avro, f"{where}: API {api} vs Avro {avro}"


def _resolve(record: dict[str, Any], path: tuple[str, ...]) -> list[dict[str, Any]]:
    """The chain of Avro records from the top-level record down `path` (outermost first)."""
    chain = [record]
    for step in path:
        if step == "[]":
            continue
        field = next(f for f in chain[-1]["fields"] if f["name"] == step)
        shape = _avro_shape(field["type"])
        shape = shape[1] if shape[0] == "nullable" else shape
        while shape[0] == "array":
            shape = shape[1]
        assert shape[0] == "record", f"{step} is not a record"
        chain.append(shape[1])
    return chain


def _check_model(
    model: type[BaseModel], record: dict[str, Any], chain: list[dict[str, Any]] | None, where: str
) -> None:
    _, _, renames = AVRO_MAPPING[model]
    chain = chain or [record]
    for name, info in model.model_fields.items():
        target = renames.get(name, name)
        scope = chain[-1 - target.count("../")]
        target = target.replace("../", "")
        field = next((f for f in scope["fields"] if f["name"] == target), None)
        assert field is not None, f"{model.__name__}.{name}: no Avro field {target!r}"
        _fits(
            _api_shape(info.annotation),
            _avro_shape(field["type"]),
            "default" in field,
            f"{model.__name__}.{name} -> {scope['name']}.{target}",
        )


@pytest.mark.parametrize("model", list(AVRO_MAPPING), ids=lambda m: m.__name__)
def test_every_api_field_has_a_compatible_avro_field(model: type[BaseModel]) -> None:
    schema_name, path, _ = AVRO_MAPPING[model]
    chain = _resolve(json.loads(schemas.schema_text(schema_name)), path)
    _check_model(model, chain[-1], chain, model.__name__)


def test_the_agreement_check_catches_a_mismatch() -> None:
    """Guard the guard: a model whose field type differs from the Avro field fails."""

    class Wrong(BaseModel):
        template_version: str | None = None

    AVRO_MAPPING[Wrong] = ("notification_request", (), {})
    try:
        with pytest.raises(AssertionError, match="template_version"):
            test_every_api_field_has_a_compatible_avro_field(Wrong)
    finally:
        del AVRO_MAPPING[Wrong]


# -- 2. round trips through the serde -------------------------------------------------------------


@pytest.fixture
def registry(tmp_path: Path) -> FileRegistry:
    return FileRegistry(tmp_path / "registry")


def _round_trip(registry: FileRegistry, name: str, record: dict[str, Any]) -> dict[str, Any]:
    data = AvroSerializer(registry, f"{name}-value", name)(record)
    return AvroDeserializer(registry, name)(data)


REQUEST_BODY = {
    "idempotency_key": "order-42-paid",
    "notification_type": "payment_result",
    "recipients": {"user_ids": ["u-1", "u-2"]},
    "template_version": 2,
    "params": {"amount": "12.50 CHF"},
    "channels": ["push", "email"],
    "send_at": "2026-03-29T02:30:00.125+02:00",
    "expire_at": "2026-03-30T00:00:00Z",
    "locale": "de-CH",
}


def test_notification_request_round_trip(registry: FileRegistry) -> None:
    model = NotificationCreate.model_validate(REQUEST_BODY)
    assert model.request_id == "order-42-paid"
    record = to_request_record(model, "n-1", "acme", "transactional", T0)
    out = _round_trip(registry, "notification_request", record)
    assert out == record
    assert out["send_at"] == datetime(2026, 3, 29, 0, 30, 0, 125000, tzinfo=UTC)


def test_segment_request_round_trip(registry: FileRegistry) -> None:
    model = NotificationCreate.model_validate(
        {
            "request_id": "camp-1",
            "notification_type": "spring_sale",
            "recipients": {"segment_id": "s-9"},
        }
    )
    record = to_request_record(model, "n-2", "acme", "bulk", T0)
    out = _round_trip(registry, "notification_request", record)
    assert out == record
    assert out["recipients"] == {"user_ids": [], "segment_id": "s-9"}
    assert out["channels"] is None and out["params"] == {}


def test_preferences_round_trip(registry: FileRegistry) -> None:
    body = {
        "category_opt_out": ["marketing"],
        "category_channel_opt_out": ["social:sms"],
        "quiet_hours": {"start": "22:00", "end": "07:30"},
        "timezone": "America/Sao_Paulo",
        "locale": "pt-BR",
    }
    model = PreferencesIn.model_validate(body)
    record = to_preferences_record("u-1", model, T0, 3)
    out = _round_trip(registry, "user_preferences", record)
    assert out == record
    view = preferences_from_record(out)
    assert view.model_dump(include=set(PreferencesIn.model_fields)) == model.model_dump()
    assert (view.user_id, view.version, view.updated_at) == ("u-1", 3, T0)


def test_the_default_preferences_are_the_api_s_defaults(registry: FileRegistry) -> None:
    """herald.user_records builds the record of a user without preferences (the consent sink
    and the unsubscribe page, below the API); it is what an empty PUT would store."""
    empty = empty_preferences("u-1", T0)
    assert empty == to_preferences_record("u-1", PreferencesIn(), T0, 0)
    assert _round_trip(registry, "user_preferences", empty) == empty
    empty["category_opt_out"].append("marketing")  # a fresh record each time, no shared lists
    assert empty_preferences("u-1", T0)["category_opt_out"] == []


def test_contact_points_round_trip(registry: FileRegistry) -> None:
    reg = DeviceRegistration(user_id="u-1", platform="fcm", token="tok-" + "x" * 100)
    record = with_device(empty_contact_points("u-1", T0), reg, "dev-1", T0)
    update = ContactPointsUpdate.model_validate(
        {"phone": {"e164": "+41791234567", "verified": True}, "email": {"address": "a@b.ch"}}
    )
    first = record["version"]
    record = with_contact_update(record, update, T0)
    assert record["version"] > first > 0  # herald.versions: the clock, above the held version
    assert _round_trip(registry, "contact_points", record) == record
    # re-registering the same token refreshes it instead of adding a device
    again = with_device(record, reg, "dev-2", T0)
    assert [d["device_id"] for d in again["devices"]] == ["dev-2"]
    cleared = with_contact_update(again, ContactPointsUpdate.model_validate({"phone": None}), T0)
    assert cleared["phone"] is None and cleared["email"] == record["email"]
    # a bounced email stays listed as disabled until the user sets one again
    bounced = {**cleared, "email": None, "disabled": ["email"]}
    phone = ContactPointsUpdate.model_validate({"phone": {"e164": "+41791234567"}})
    assert with_contact_update(bounced, phone, T0)["disabled"] == ["email"]
    fresh = ContactPointsUpdate.model_validate({"email": {"address": "new@b.ch"}})
    assert with_contact_update(bounced, fresh, T0)["disabled"] == []
    removed = without_device(cleared, "dev-2", T0)
    assert removed["devices"] == [] and without_device(removed, "dev-2", T0) is removed
    assert _round_trip(registry, "contact_points", removed) == removed


# -- 3. bad input is a validation error ---------------------------------------------------------


def _body(**changes: Any) -> dict[str, Any]:
    body = dict(REQUEST_BODY)
    for key, value in changes.items():
        if value is ...:
            body.pop(key, None)
        else:
            body[key] = value
    return body


@pytest.mark.parametrize(
    "body",
    [
        _body(surprise=1),
        _body(request_id="r-1"),  # both request_id and idempotency_key
        _body(idempotency_key=...),
        _body(recipients={}),
        _body(recipients={"user_ids": ["a"], "segment_id": "s"}),
        _body(recipients={"user_ids": []}),
        _body(recipients={"user_ids": [f"u{i}" for i in range(1001)]}),
        _body(recipients={"user_ids": ["a", "a"]}),
        _body(channels=["fax"]),
        _body(channels=["sms", "sms"]),
        _body(send_at="2026-03-29T02:30:00"),  # naive: no time zone
        _body(expire_at="2026-03-29T00:00:00Z"),  # before send_at
        _body(template_version="two"),
        _body(params={"n": 1}),
        _body(locale="not a locale"),
        _body(notification_type="Critical!"),
    ],
)
def test_invalid_notification_bodies_are_rejected(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        NotificationCreate.model_validate(body)


@pytest.mark.parametrize(
    "body",
    [
        {"timezone": "Mars/Olympus_Mons"},
        {"timezone": "../etc/passwd"},
        {"quiet_hours": {"start": "24:00", "end": "07:00"}},
        {"quiet_hours": {"start": "7:00", "end": "08:00"}},
        {"quiet_hours": {"start": "07:00", "end": "07:00"}},
        {"category_channel_opt_out": ["marketing"]},
        {"channel_opt_out": ["pager"]},
        {"version": 3},
    ],
)
def test_invalid_preferences_are_rejected(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        PreferencesIn.model_validate(body)


@pytest.mark.parametrize("phone", ["0791234567", "+0791234567", "+12345", "+41 79", "41791234567"])
def test_invalid_phone_numbers_are_rejected(phone: str) -> None:
    with pytest.raises(ValidationError):
        ContactPointsUpdate.model_validate({"phone": {"e164": phone}})


@pytest.mark.parametrize(
    "phone", ["+41 79 123 45 67", "+41-79-123-45-67", "+\u0664\u0661791234567"]
)
def test_phone_spellings_become_one_e164_number(phone: str) -> None:
    update = ContactPointsUpdate.model_validate({"phone": {"e164": phone}})
    assert update.phone is not None and update.phone.e164 == "+41791234567"


@pytest.mark.parametrize(
    "body",
    [
        {"user_id": "u-1", "platform": "windows", "token": "x" * 64},
        {"user_id": "u-1", "platform": "apns", "token": "short"},
        {"user_id": "u-1", "platform": "apns", "token": "has space" * 8},
        {"user_id": "", "platform": "apns", "token": "x" * 64},
    ],
)
def test_invalid_device_registrations_are_rejected(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        DeviceRegistration.model_validate(body)
