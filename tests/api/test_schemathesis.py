"""Property-based run of the published OpenAPI schema against the live API: every check.

One app (own topic prefix) serves every operation; schemathesis generates bounded examples per
operation (valid and invalid bodies, paths, queries) and fails on any server error.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import CHECKS
from schemathesis.core.failures import FailureGroup

from api.app import create_app
from api.settings import ProviderSecrets
from herald.config import HeraldSettings, RegistrySettings
from infra.topics import create_topics
from tests.api.conftest import (
    EMAIL_KEYS,
    FULL_KEY,
    SMS_A_TOKEN,
    SMS_B_SECRET,
    make_api_settings,
    make_tenants,
    serve,
)
from tests.conftest import RunningStack, mark_users_restored, unique_prefix

MAX_EXAMPLES = 40
RESPONSE_TIMEOUT_S = 60.0
REPO = Path(__file__).resolve().parents[2]
CALLS: list[int] = []


@pytest.fixture(scope="module")
def live_url(stack: RunningStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    kafka = stack.settings.kafka.model_copy(update={"topic_prefix": unique_prefix()})
    create_topics(kafka)
    mark_users_restored(stack.settings.redis.url, kafka.topic_prefix)
    registry = RegistrySettings(path=tmp_path_factory.mktemp("st-registry"))
    herald: HeraldSettings = stack.settings.model_copy(
        update={"kafka": kafka, "registry": registry}
    )
    providers = ProviderSecrets(
        sms_a_auth_token=SMS_A_TOKEN,
        sms_b_signature_secret=SMS_B_SECRET,
        email_webhook_public_key=EMAIL_KEYS.public_b64,
    )
    app = create_app(herald, api=make_api_settings(), providers=providers, tenants=make_tenants())
    yield from serve(app)


def test_every_check_passes_and_no_server_errors(live_url: str) -> None:
    """Every operation, MAX_EXAMPLES generated cases each, every schemathesis check (as
    `schemathesis run --checks all` with the repository's schemathesis.toml): no 5xx, no
    undocumented status, content type, header or method, no response off its schema."""
    config = schemathesis.Config.from_path(REPO / "schemathesis.toml")
    schema = schemathesis.openapi.from_url(f"{live_url}/openapi.json", config=config)
    checks = CHECKS.get_all()
    failures: list[str] = []
    operations = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1

        @settings(
            max_examples=MAX_EXAMPLES,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        @given(case=operation.as_strategy())
        def run(case: schemathesis.Case) -> None:
            # 60 s, not schemathesis' 10: a segment upload waits for ClickHouse, which beside
            # two other test lanes once took longer than 10 s (a slow answer is not a failed
            # check; latency is the benchmarks')
            response = case.call(
                base_url=live_url, headers={"X-API-Key": FULL_KEY}, timeout=RESPONSE_TIMEOUT_S
            )
            CALLS.append(response.status_code)
            try:
                case.validate_response(response, checks=checks)
            except FailureGroup as exc:
                found = sorted({f"{type(e).__name__}: {getattr(e, 'title', e)}"
                                for e in exc.exceptions})  # fmt: skip
                failures.append(f"{case.method} {case.formatted_path} -> "
                                f"{response.status_code}: {'; '.join(found)}")  # fmt: skip

        run()
    assert operations >= 15
    assert len(CALLS) >= 10 * operations  # the run really exercised the API
    assert not failures, "\n".join(sorted(set(failures))[:30])
