"""herald.providers, the one table of providers, and every place that registers a provider's
parts against it: a provider added to the table without its client, budget, simulator,
receipt parser or callback fails here, naming what is missing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from api.routes.callbacks import CHECKS
from api.routes.callbacks import PROVIDERS as CALLBACK_PROVIDERS
from dashboards.server import DEFAULT_PROVIDERS as DASHBOARD_PROVIDERS
from herald import receipts
from herald.providers import DEFAULT_PROVIDER, EXTERNAL, PROVIDERS, WEBHOOK, providers_of
from infra.simulators import SIMULATORS
from infra.stackclient import SIMULATORS as STACK_SIMULATORS
from sinks.dispatch.clients import default_factories
from sinks.dispatch.settings import DispatchSettings
from sinks.provider_registry import MODULES, spec, specs


def test_the_table() -> None:
    assert providers_of("sms") == ("sms_a", "sms_b", "sms_c")
    assert providers_of("push") == ("apns", "fcm") and providers_of("fax") == ()
    assert EXTERNAL == ("apns", "fcm", "sms_a", "sms_b", "sms_c", "email")
    assert WEBHOOK == ("sms_a", "sms_b", "sms_c", "email")
    for channel, provider in DEFAULT_PROVIDER.items():
        assert provider in providers_of(channel), channel


def test_every_provider_has_a_client_and_every_external_one_a_budget() -> None:
    assert set(default_factories("redis://127.0.0.1:1")) == set(PROVIDERS)
    assert set(DispatchSettings().rates) == set(EXTERNAL)


def test_every_external_provider_has_a_simulator_the_stack_starts() -> None:
    assert set(SIMULATORS) == set(EXTERNAL)
    assert STACK_SIMULATORS == DASHBOARD_PROVIDERS == EXTERNAL


@pytest.mark.parametrize("provider", WEBHOOK)
def test_every_webhook_provider_has_a_callback_route_and_a_receipt_parser(provider: str) -> None:
    assert provider in CALLBACK_PROVIDERS and provider in CHECKS
    # a receipt format in herald/receipts.py, or its folder's (registered by the receipts job)
    assert provider in receipts.sources() or spec(provider).receipts is not None
    assert receipts.CHANNEL_OF[provider] == PROVIDERS[provider].channel


def test_the_registry_and_the_table_name_the_same_providers() -> None:
    assert list(MODULES) == list(EXTERNAL) == [s.name for s in specs()]
    env = spec("sms_b").client_env({"base_url": "u", "api_key": "k", "api_secret": "s"}, "http://h")
    assert env["HERALD_VONAGE_BASE_URL"] == "u"
    assert env["HERALD_VONAGE_CALLBACK_URL"] == "http://h/v1/callbacks/sms_b"


def test_reading_the_registry_loads_no_client() -> None:
    """The simulators, the launcher and the dispatch settings read every provider's SPEC; none
    of them pays for loading the clients (httpx, jh2, google-auth...)."""
    code = (
        "import sys; from sinks.provider_registry import specs; specs(); "
        "from sinks.dispatch.settings import DispatchSettings; DispatchSettings(); "
        "print(sorted(m for m in sys.modules if m in ('httpx', 'sinks.providers.base') "
        "or m.startswith('sinks.providers.') and m.endswith('.client')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
