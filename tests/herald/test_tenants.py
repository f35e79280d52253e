"""herald.tenants: what a tenant may send when its request did not come through the API."""

from __future__ import annotations

from pathlib import Path

import pytest

from herald.config import DEFAULT_TENANTS_FILE
from herald.errors import ConfigError, InvalidRequest
from herald.planning import admit_request
from herald.tenants import TenantTypes
from tests.herald.test_planning import CATALOG, record

TENANTS = """
[tenants.orders]
rate_limit_per_second = 50
[[tenants.orders.keys]]
id = "orders-1"
sha256 = "00"
scopes = ["notifications:write"]
types = ["order_shipped"]
[[tenants.orders.keys]]
id = "orders-2"
sha256 = "01"
scopes = ["notifications:write"]
types = ["marketing_campaign"]

[tenants.ops]
[[tenants.ops.keys]]
id = "ops"
sha256 = "02"
scopes = ["notifications:write"]

[tenants.retired]
rate_limit_per_second = 1
"""


@pytest.fixture
def types(tmp_path: Path) -> TenantTypes:
    path = tmp_path / "tenants.toml"
    path.write_text(TENANTS)
    return TenantTypes.load(path)


def _code(refused: InvalidRequest | None) -> str | None:
    return None if refused is None else refused.code


def test_a_tenant_may_send_what_its_keys_may_send_together(types: TenantTypes) -> None:
    assert types.refusal("orders", "order_shipped") is None
    assert types.refusal("orders", "marketing_campaign") is None  # its other key's
    assert _code(types.refusal("orders", "otp_login")) == "type_not_allowed"
    assert types.refusal("ops", "otp_login") is None  # a key without `types`: every type


def test_a_tenant_without_a_key_may_send_nothing(types: TenantTypes) -> None:
    assert _code(types.refusal("retired", "order_shipped")) == "unknown_tenant"
    refused = types.refusal("nobody", "order_shipped")
    assert _code(refused) == "unknown_tenant" and refused is not None and "nobody" in refused.detail


def test_the_bundled_file_lets_the_dev_tenant_send_every_type() -> None:
    bundled = TenantTypes.load(DEFAULT_TENANTS_FILE)
    assert bundled.refusal("dev", "otp_login") is None


def test_an_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        TenantTypes.load(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[tenants\n")
    with pytest.raises(ConfigError):
        TenantTypes.load(bad)


def test_admission_checks_the_tenant_of_every_producer_but_the_api_and_the_digest_job(
    types: TenantTypes,
) -> None:
    from herald.ids import notification_id

    def producer(tenant: str, source: str = "producer") -> dict[str, object]:
        return record(tenant_id=tenant, source=source,
                      notification_id=notification_id(tenant, "r-1"))  # fmt: skip

    assert admit_request(producer("orders"), CATALOG, "t:0:0", types).tenant_id == "orders"
    for rec, code in (
        (producer("ops2"), "unknown_tenant"),
        (producer("orders", "outbox") | {"notification_type": "order_shipped",
                                         "params": {"order_id": "1"}}, None),
        (record(tenant_id="orders", notification_type="otp_login", params={"code": "1"},
                source="outbox", notification_id=notification_id("orders", "r-1")),
         "type_not_allowed"),
    ):  # fmt: skip
        if code is None:
            admit_request(rec, CATALOG, "t:0:0", types)
            continue
        with pytest.raises(InvalidRequest) as info:
            admit_request(rec, CATALOG, "t:0:0", types)
        assert info.value.code == code
    # the API checked its key; the digest job made its request from the catalog's rules
    assert admit_request(record(tenant_id="nobody"), CATALOG, "t:0:0", types)
    digest = record(tenant_id="nobody", source="digest",
                    notification_id=notification_id("nobody", "r-1"))  # fmt: skip
    assert admit_request(digest, CATALOG, "t:0:0", types)
