"""FCM simulator: OAuth2 JWT-bearer token endpoint (google-auth) and messages:send wire format."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import google.auth.exceptions
import google.auth.transport.requests
import httpx
import pytest
from google.oauth2 import service_account

from infra.simulators.keys import rsa_private_pem
from infra.simulators.launcher import RunningSimulator

SCOPE = "https://www.googleapis.com/auth/firebase.messaging"


def credentials(sim: RunningSimulator, private_key: str | None = None) -> Any:
    info = json.loads(Path(sim.credentials()["service_account_path"]).read_text())
    if private_key:
        info["private_key"] = private_key
    return service_account.Credentials.from_service_account_info(info, scopes=[SCOPE])


def access_token(sim: RunningSimulator) -> str:
    creds = credentials(sim)
    creds.refresh(google.auth.transport.requests.Request())
    return str(creds.token)


def send(
    sim: RunningSimulator,
    message: dict[str, Any],
    token: str | None = None,
    project: str | None = None,
) -> httpx.Response:
    project = project or sim.credentials()["project_id"]
    return httpx.post(
        f"{sim.base_url}/v1/projects/{project}/messages:send",
        json={"message": message},
        headers={"authorization": f"Bearer {token or access_token(sim)}"},
    )


def test_google_auth_gets_a_token_and_send_accepts(fcm: RunningSimulator) -> None:
    token = access_token(fcm)
    assert token.startswith("ya29.")
    resp = send(fcm, {"token": "tok-1", "data": {"delivery_id": "d-1"}}, token)
    assert resp.status_code == 200
    name = resp.json()["name"]
    assert name.startswith(f"projects/{fcm.credentials()['project_id']}/messages/0:")
    assert fcm.stats()["accepted_ids"]["tok-1"][0][1] == "d-1"


def test_token_endpoint_rejects_a_foreign_key(fcm: RunningSimulator) -> None:
    creds = credentials(fcm, private_key=rsa_private_pem().decode())
    with pytest.raises(google.auth.exceptions.RefreshError, match="invalid_grant"):
        creds.refresh(google.auth.transport.requests.Request())


def test_unauthenticated_and_wrong_project(fcm: RunningSimulator) -> None:
    bad = send(fcm, {"token": "t"}, token="ya29.forged")
    assert bad.status_code == 401 and bad.json()["error"]["status"] == "UNAUTHENTICATED"
    other = send(fcm, {"token": "t"}, project="someone-else")
    assert other.status_code == 403 and other.json()["error"]["status"] == "PERMISSION_DENIED"


@pytest.mark.parametrize(
    "message",
    [
        {"token": "t", "topic": "news"},
        {"token": "t", "data": {"n": 1}},
        {"token": "t", "android": {"ttl": "1 hour"}},
        {"token": "t", "data": {"blob": "x" * 5000}},
        {"token": "t", "android": {"notification": {"tag": 7}}},
    ],
)
def test_invalid_argument(fcm: RunningSimulator, message: dict[str, Any]) -> None:
    resp = send(fcm, message)
    error = resp.json()["error"]
    assert resp.status_code == 400 and error["status"] == "INVALID_ARGUMENT"
    assert error["details"][0]["errorCode"] == "INVALID_ARGUMENT"


def test_dead_and_invalid_tokens(fcm: RunningSimulator) -> None:
    fcm.configure(unregistered=["dead"], invalid=["junk"])
    token = access_token(fcm)
    gone = send(fcm, {"token": "dead"}, token)
    junk = send(fcm, {"token": "junk"}, token)
    assert gone.status_code == 404
    assert gone.json()["error"]["details"][0]["errorCode"] == "UNREGISTERED"
    assert junk.status_code == 400 and "not a valid FCM registration token" in junk.text


@pytest.mark.parametrize(
    ("code", "status", "retry_after"),
    [("QUOTA_EXCEEDED", 429, True), ("UNAVAILABLE", 503, True), ("INTERNAL", 500, False)],
)
def test_error_mix(fcm: RunningSimulator, code: str, status: int, retry_after: bool) -> None:
    fcm.configure(errors={code: 1.0})
    resp = send(fcm, {"token": "t"})
    assert resp.status_code == status
    assert resp.json()["error"]["details"][0]["errorCode"] == code
    assert ("retry-after" in resp.headers) is retry_after


def test_validate_only_is_not_recorded(fcm: RunningSimulator) -> None:
    token = access_token(fcm)
    resp = httpx.post(
        f"{fcm.base_url}/v1/projects/{fcm.credentials()['project_id']}/messages:send",
        json={"validate_only": True, "message": {"token": "t"}},
        headers={"authorization": f"Bearer {token}"},
    )
    assert resp.json()["name"].endswith("/fake_message_id")
    assert fcm.stats()["accepted"] == 0
