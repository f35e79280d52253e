"""`herald segments ...` and `herald pause | resume | cancel | progress` against the API served
over real HTTP (tests/api/conftest.py)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infra import cli_api
from infra.cli import app
from infra.stackclient import StackClient
from tests.api.conftest import FULL_KEY, RunningApi, api  # noqa: F401 - the fixture, by name


@pytest.fixture
def cli(api: RunningApi, monkeypatch: pytest.MonkeyPatch) -> CliRunner:  # noqa: F811
    """The commands talk to the test's API (instead of a stack's run directory)."""
    monkeypatch.setattr(cli_api, "stack_client", lambda *_: StackClient(api.url, api_key=FULL_KEY))
    return CliRunner()


def test_upload_list_show_query_delete(cli: CliRunner, tmp_path: Path) -> None:
    sid, copy = f"cli-{uuid.uuid4().hex[:10]}", f"cli-{uuid.uuid4().hex[:10]}"
    members = tmp_path / "members.csv"
    members.write_text("user_id,first_name\n" + "".join(f"u{i},n{i}\n" for i in range(5000)))
    done = cli.invoke(app, ["segments", "upload", sid, str(members)])
    assert done.exit_code == 0, done.output
    assert f"{sid}: 5,000 users (upload" in done.output
    again = cli.invoke(app, ["segments", "upload", sid, str(members)])
    assert again.exit_code == 1 and "segment_exists" in again.output
    sql = f"SELECT user_id FROM segment_members WHERE segment_id = '{sid}' AND user_id < 'u2'"
    queried = cli.invoke(app, ["segments", "query", copy, sql])
    assert queried.exit_code == 0 and f"{copy}: 1,112 users (query" in queried.output
    listed = cli.invoke(app, ["segments", "list", "--json"])
    ids = [json.loads(line)["segment_id"] for line in listed.output.splitlines()]
    assert listed.exit_code == 0 and {sid, copy} <= set(ids)
    assert "5,000 users" in cli.invoke(app, ["segments", "show", sid]).output
    assert cli.invoke(app, ["segments", "delete", sid, "--yes"]).exit_code == 0
    gone = cli.invoke(app, ["segments", "show", sid])
    assert gone.exit_code == 1 and "segment_not_found" in gone.output


def test_pause_resume_cancel_and_progress(cli: CliRunner, api: RunningApi) -> None:  # noqa: F811
    with StackClient(api.url, api_key=FULL_KEY) as client:
        nid = client.send({
            "request_id": f"cli-{uuid.uuid4().hex[:10]}", "notification_type": "order_shipped",
            "recipients": {"user_ids": ["u-1", "u-2"]}, "params": {"order_id": "42"},
        })  # fmt: skip
    paused = cli.invoke(app, ["pause", nid])
    assert paused.exit_code == 0 and f"{nid}: running -> paused" in paused.output
    shown = cli.invoke(app, ["progress", nid])
    assert shown.exit_code == 0 and f"{nid} [paused]: deliveries 0" in shown.output
    assert "paused -> running" in cli.invoke(app, ["resume", nid]).output
    assert "running -> cancelled" in cli.invoke(app, ["cancel", nid]).output
    refused = cli.invoke(app, ["pause", nid])
    assert refused.exit_code == 1 and "notification_cancelled" in refused.output
