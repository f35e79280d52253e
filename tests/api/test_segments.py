"""Segments over real HTTP into the session's ClickHouse: uploads, queries, ownership, campaigns."""

from __future__ import annotations

import tracemalloc
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import httpx
import orjson
import pytest
from clickhouse_connect.driver.client import Client

from api.app import create_app
from dataflows.plan.audience import load_segment
from herald.clickhouse import herald_client
from herald.config import HeraldSettings
from tests.api.conftest import (
    FULL_KEY,
    ORDERS_KEY,
    READ_KEY,
    RIVAL_KEY,
    SEGMENTS_KEY,
    RunningApi,
    make_api_settings,
    make_tenants,
    serve,
)
from tests.conftest import mark_users_restored

NDJSON = {"Content-Type": "application/x-ndjson"}
CSV = {"Content-Type": "text/csv; charset=utf-8"}


def new_id() -> str:
    return f"seg-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def ch(settings: HeraldSettings) -> Iterator[Client]:
    client = herald_client(settings.clickhouse)
    yield client
    client.close()


@pytest.fixture
def small_chunks(settings: HeraldSettings) -> Iterator[RunningApi]:
    """The API inserting members two at a time (a failed upload has inserted some)."""
    mark_users_restored(settings.redis.url, settings.kafka.topic_prefix)
    api = make_api_settings(segment_insert_rows=2)
    app = create_app(settings, api=api, tenants=make_tenants())
    for url in serve(app):
        yield RunningApi(url, settings, app)


def members(ch: Client, segment_id: str) -> dict[str, dict[str, str]]:
    rows = ch.query(
        "SELECT user_id, params FROM segment_members WHERE segment_id = {s:String}",
        parameters={"s": segment_id},
    ).result_rows
    return {user: dict(params) for user, params in rows}


def lines(*items: Any) -> bytes:
    return b"".join(orjson.dumps(item) + b"\n" for item in items)


def campaign(segment_id: str) -> dict[str, Any]:
    return {
        "request_id": f"camp-{uuid.uuid4().hex}",
        "notification_type": "marketing_campaign",
        "recipients": {"segment_id": segment_id},
        "params": {"headline": "Sale", "offer": "-20%", "cta_url": "https://x.test/s"},
    }


def test_ndjson_upload_counts_distinct_users(api: RunningApi, ch: Client) -> None:
    sid = new_id()
    body = lines("u1", {"user_id": "u2", "params": {"first_name": "Ada"}}, "u1") + b"\n  \n"
    with api.client() as http:
        resp = http.put(f"/v1/segments/{sid}", content=body, headers=NDJSON)
        shown = http.get(f"/v1/segments/{sid}")
    assert resp.status_code == 201, resp.text
    out = resp.json()
    assert out["segment_id"] == sid and out["size"] == 2 and out["source"] == "upload"
    assert datetime.fromisoformat(out["created_at"]).tzinfo is not None
    assert shown.status_code == 200 and shown.json() == out
    assert members(ch, sid) == {"u1": {}, "u2": {"first_name": "Ada"}}


def test_csv_upload_columns_become_params(api: RunningApi, ch: Client) -> None:
    sid = new_id()
    body = '\ufeffuser_id,first_name,city\nu1,Ada,"Zürich, ""CH""\nold town"\nu2,,Bern\n\n'
    with api.client() as http:
        resp = http.put(f"/v1/segments/{sid}", content=body.encode(), headers=CSV)
    assert resp.status_code == 201, resp.text
    assert resp.json()["size"] == 2
    assert members(ch, sid) == {
        "u1": {"first_name": "Ada", "city": 'Zürich, "CH"\nold town'},
        "u2": {"city": "Bern"},
    }


def test_a_segment_is_an_immutable_snapshot(api: RunningApi) -> None:
    sid = new_id()
    with api.client() as http:
        first = http.put(f"/v1/segments/{sid}", content=lines("a"), headers=NDJSON)
        again = http.put(f"/v1/segments/{sid}", content=lines("b"), headers=NDJSON)
    with api.client(RIVAL_KEY) as rival:
        theirs = rival.put(f"/v1/segments/{sid}", content=lines("b"), headers=NDJSON)
    assert first.status_code == 201
    assert again.status_code == 409 and again.json()["code"] == "segment_exists"
    assert theirs.status_code == 409 and theirs.json()["code"] == "segment_exists"


def test_a_bad_line_names_its_number_and_nothing_is_kept(
    small_chunks: RunningApi, ch: Client
) -> None:
    """Four good lines (two inserts of two) before the bad one: they are deleted again, the id
    is not visible, and the owner may upload it again."""
    sid = new_id()
    bad = lines("u1", "u2", "u3", "u4") + b'"has space"\n' + lines("u6")
    with small_chunks.client() as http:
        resp = http.put(f"/v1/segments/{sid}", content=bad, headers=NDJSON)
        assert resp.status_code == 422, resp.text
        problem = resp.json()
        assert problem["code"] == "invalid_line" and problem["line"] == 5
        assert problem["errors"][0]["code"] == "invalid_user_id"
        assert "has space" not in resp.text  # no value echoed
        assert members(ch, sid) == {}
        assert http.get(f"/v1/segments/{sid}").status_code == 404
        resp = http.put(f"/v1/segments/{sid}", content=lines("u1", "u2", "u3"), headers=NDJSON)
        assert resp.status_code == 201 and resp.json()["size"] == 3
    assert set(members(ch, sid)) == {"u1", "u2", "u3"}


BAD_LINES = [  # body, headers, line, reason
    (b'"u1"\n{"user_id": "u2", "extra": 1}\n', NDJSON, 2, "invalid_member"),
    (b'"u1"\n\n{"user_id": "u3"\n', NDJSON, 3, "malformed_json"),
    (b'{"user_id": "u1", "params": {"n": 1}}\n', NDJSON, 1, "invalid_params"),
    (b"user_id,name\nu1,a\nu2\n", CSV, 3, "wrong_field_count"),
    (b"user_id,user_id\nu1,u2\n", CSV, 1, "invalid_header"),
    (b"name\nAda\n", CSV, 1, "invalid_header"),
    (b'user_id\n"u1\n', CSV, 2, "malformed_csv"),
    (b"x" * (70 * 1024), NDJSON, 1, "line_too_long"),
]


def test_bad_lines(api: RunningApi) -> None:
    with api.client() as http:
        for body, headers, line, reason in BAD_LINES:
            resp = http.put(f"/v1/segments/{new_id()}", content=body, headers=headers)
            assert resp.status_code == 422, resp.text
            assert (resp.json()["line"], resp.json()["errors"][0]["code"]) == (line, reason)


def test_empty_and_unsupported_uploads(api: RunningApi) -> None:
    with api.client() as http:
        empty = http.put(f"/v1/segments/{new_id()}", content=b"\n", headers=NDJSON)
        header_only = http.put(f"/v1/segments/{new_id()}", content=b"user_id\n", headers=CSV)
        json_body = http.put(f"/v1/segments/{new_id()}", json=["u1"])
    assert empty.status_code == 422 and empty.json()["code"] == "empty_segment"
    assert header_only.status_code == 422 and header_only.json()["code"] == "empty_segment"
    assert json_body.status_code == 415 and json_body.json()["code"] == "unsupported_media_type"


def test_query_makes_a_segment(api: RunningApi, ch: Client) -> None:
    source = new_id()
    upload = lines("a", {"user_id": "b", "params": {"tier": "gold"}}, "c")
    with api.client() as http:
        assert http.put(f"/v1/segments/{source}", content=upload, headers=NDJSON).is_success
        gold_id, gold_sql = (
            new_id(),
            (
                "SELECT user_id, params FROM segment_members\n"
                f"WHERE segment_id = '{source}' AND params['tier'] = 'gold';"
            ),
        )
        gold = http.post("/v1/segments", json={"segment_id": gold_id, "query": gold_sql})
        numbers_id, numbers_sql = new_id(), "SELECT number FROM numbers(1000)"  # UInt64 ids
        numbers = http.post("/v1/segments", json={"segment_id": numbers_id, "query": numbers_sql})
    assert gold.status_code == 201, gold.text
    assert gold.json()["size"] == 1 and gold.json()["source"] == "query"
    assert members(ch, gold_id) == {"b": {"tier": "gold"}}
    assert numbers.status_code == 201 and numbers.json()["size"] == 1000
    assert "999" in members(ch, numbers_id)


REFUSED_QUERIES = [
    "INSERT INTO segment_members (segment_id, user_id) VALUES ('x', 'y')",
    "DROP TABLE segment_members",
    "SELECT 1; DROP TABLE segments",
    "SELECT * FROM file('/etc/hostname', 'LineAsString')",
    "SELECT user_id FROM segment_members SETTINGS max_execution_time = 100000",
    "SELEKT 1",
    "SELECT 'u1', 'u2', 'u3'",
]


def test_a_query_only_reads(api: RunningApi, ch: Client) -> None:
    with api.client() as http:
        for query in REFUSED_QUERIES:
            resp = http.post("/v1/segments", json={"segment_id": (sid := new_id()), "query": query})
            assert resp.status_code == 422, resp.text
            assert resp.json()["code"] == "invalid_query" and resp.json()["detail"], query
            assert "for url" not in resp.text  # ClickHouse's message, not the client's address
            assert members(ch, sid) == {}
        bad_id = "SELECT arrayJoin(['u1', 'has space'])"
        resp = http.post("/v1/segments", json={"segment_id": (sid := new_id()), "query": bad_id})
        assert resp.status_code == 422 and resp.json()["code"] == "invalid_row"
        assert resp.json()["row"] == 2 and "has space" not in resp.text
        assert members(ch, sid) == {}
    assert ch.command("EXISTS TABLE segment_members") == ch.command("EXISTS TABLE segments") == 1


def test_list_show_delete(api: RunningApi, ch: Client) -> None:
    mine = sorted(new_id() for _ in range(3))
    with api.client() as http:
        for sid in mine:
            assert http.put(f"/v1/segments/{sid}", content=lines("u1"), headers=NDJSON).is_success
        listed: list[str] = []
        cursor: str | None = mine[0][:-1]  # just before mine (other tests' segments around)
        while cursor is not None and (not listed or listed[-1] < mine[-1]):
            page = http.get("/v1/segments", params={"limit": 2, "cursor": cursor})
            assert page.status_code == 200, page.text
            listed += [s["segment_id"] for s in page.json()["segments"]]
            cursor = page.json()["next_cursor"]
        assert listed == sorted(listed) and set(mine) <= set(listed) and len(listed) >= 3
        assert http.delete(f"/v1/segments/{mine[0]}").status_code == 204
        assert http.get(f"/v1/segments/{mine[0]}").json()["code"] == "segment_not_found"
        assert http.delete(f"/v1/segments/{mine[0]}").status_code == 404
        after = http.get("/v1/segments", params={"limit": 1000, "cursor": mine[0][:-1]}).json()
        assert mine[0] not in [s["segment_id"] for s in after["segments"]]
        assert members(ch, mine[0]) == {}
        sent = http.post("/v1/notifications", json=campaign(mine[0]))
        assert sent.status_code == 404 and sent.json()["code"] == "segment_not_found"
        again = http.put(f"/v1/segments/{mine[0]}", content=lines("u9"), headers=NDJSON)
        assert again.status_code == 201 and members(ch, mine[0]) == {"u9": {}}
        assert http.post("/v1/notifications", json=campaign(mine[1])).status_code == 202


def test_another_tenants_segment_is_not_found(api: RunningApi, settings: HeraldSettings) -> None:
    sid, legacy = new_id(), new_id()
    load_segment(settings.clickhouse, legacy, ["u1", "u2"])  # by hand: no registry row
    with api.client() as http:
        assert http.put(f"/v1/segments/{sid}", content=lines("u1"), headers=NDJSON).is_success
    with api.client(RIVAL_KEY) as rival:
        shown = rival.get(f"/v1/segments/{sid}")
        deleted = rival.delete(f"/v1/segments/{sid}")
        listed = rival.get("/v1/segments", params={"limit": 1000}).json()["segments"]
        sent = rival.post("/v1/notifications", json=campaign(sid))
        to_legacy = rival.post("/v1/notifications", json=campaign(legacy))
        taken = rival.put(f"/v1/segments/{legacy}", content=lines("u3"), headers=NDJSON)
    assert shown.status_code == 404 and shown.json()["code"] == "segment_not_found"
    assert deleted.status_code == 404 and sid not in [s["segment_id"] for s in listed]
    assert sent.status_code == 404 and sent.json()["code"] == "segment_not_found"
    assert to_legacy.status_code == 202, to_legacy.text
    assert taken.status_code == 409 and taken.json()["code"] == "segment_exists"


def test_scopes_and_allow_lists(api: RunningApi) -> None:
    query = {"segment_id": new_id(), "query": "SELECT 'u1'"}
    with api.client(READ_KEY) as reader:
        assert reader.get("/v1/segments").json()["code"] == "insufficient_scope"
    with api.client(SEGMENTS_KEY) as key:
        denied = key.post("/v1/segments", json=query)
        assert denied.status_code == 403 and denied.json()["scope"] == "segments:query"
        assert key.put(f"/v1/segments/{new_id()}", content=lines("u1"), headers=NDJSON).is_success
    with api.client(ORDERS_KEY) as orders:  # segments = []: no segment at all
        put = orders.put(f"/v1/segments/{new_id()}", content=lines("u1"), headers=NDJSON)
        assert put.status_code == 403 and put.json()["code"] == "segment_not_allowed"
        assert orders.get(f"/v1/segments/{new_id()}").json()["code"] == "segment_not_allowed"
        assert orders.get("/v1/segments").json() == {"segments": [], "next_cursor": None}
    with api.client(None) as anonymous:
        assert anonymous.get("/v1/segments").status_code == 401


def test_200k_members_stream_in_chunks(settings: HeraldSettings, ch: Client) -> None:
    """A 200,000-line upload sent chunked, never whole: the API inserts it 20,000 rows at a time,
    and the process's Python heap grows by far less than the members would take held at once
    (~60 MB as rows)."""
    mark_users_restored(settings.redis.url, settings.kafka.topic_prefix)
    app = create_app(settings, api=make_api_settings(segment_insert_rows=20_000),
                     tenants=make_tenants())  # fmt: skip
    sid, total = new_id(), 200_000

    def body() -> Iterator[bytes]:
        for start in range(0, total, 5000):
            yield b"".join(b'"user-%07d"\n' % i for i in range(start, start + 5000))

    for url in serve(app):
        with httpx.Client(base_url=url, headers={"X-API-Key": FULL_KEY}, timeout=60) as http:
            warm = http.put(f"/v1/segments/{new_id()}", content=lines("u1"), headers=NDJSON)
            assert warm.status_code == 201  # the modules an upload imports are loaded
            tracemalloc.start()
            try:
                resp = http.put(f"/v1/segments/{sid}", content=body(), headers=NDJSON)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
    assert resp.status_code == 201, resp.text
    assert resp.json()["size"] == total
    assert (
        ch.command(
            "SELECT count() FROM segment_members WHERE segment_id = {s:String}",
            parameters={"s": sid},
        )
        == total
    )
    assert peak < 25 * 2**20, f"peak {peak / 2**20:.1f} MiB"
