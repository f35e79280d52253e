"""The embedded ClickHouse service against the real clickhouse-connect HTTP client.

The server runs as a real subprocess (`python -m infra.clickhouse_server`) on a free port with a
temporary data directory. `running_server` is imported by the migration and sink tests too.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.error import URLError
from urllib.parse import quote

import pytest
from clickhouse_connect import get_client
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import DatabaseError

from herald.clickhouse import herald_client
from herald.config import ClickHouseSettings
from infra.process import free_port

REPO = Path(__file__).resolve().parents[2]
UTC = dt.UTC


def start_server(data_dir: Path, port: int) -> subprocess.Popen[bytes]:
    """Start the service and wait until GET /ping answers (or the process dies)."""
    log = (data_dir.parent / f"clickhouse-{port}.log").open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "infra.clickhouse_server", "--data-dir", str(data_dir),
         "--host", "127.0.0.1", "--port", str(port)],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        url = f"http://127.0.0.1:{port}/ping"
        with contextlib.suppress(URLError, ConnectionError), urllib.request.urlopen(url) as resp:
            if resp.status == 200:
                return proc
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"clickhouse server did not start; see {log.name}")


def stop_server(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> int:
    """Signal the service and wait for it; kill it (and fail) if it hangs."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            return proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
    return int(proc.returncode)


@contextlib.contextmanager
def running_server(data_dir: Path) -> Iterator[str]:
    """A running service on a free port; yields its DSN and stops it (SIGTERM) afterwards."""
    proc = start_server(data_dir, free_port())
    try:
        yield f"http://127.0.0.1:{proc.args[-1]}"  # type: ignore[index]
    finally:
        assert stop_server(proc) == 0


@pytest.fixture(scope="module")
def dsn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_server(tmp_path_factory.mktemp("chserver") / "data") as url:
        yield url


@pytest.fixture(params=[False, True, "zstd", "gzip"], ids=["plain", "lz4", "zstd", "gzip"])
def client(dsn: str, request: pytest.FixtureRequest) -> Iterator[Client]:
    """The ordinary client, with each request compression it can use."""
    c = get_client(dsn=dsn, compress=request.param)
    c.command("CREATE DATABASE IF NOT EXISTS t_server")
    c.database = "t_server"
    yield c
    c.close()


EVENT_COLUMNS = ["id", "kind", "note", "at", "attrs", "n", "latency"]
NOW = dt.datetime(2026, 3, 29, 1, 30, 15, 123000, tzinfo=UTC)


def make_table(client: Client, name: str) -> None:
    client.command(f"DROP TABLE IF EXISTS {name}")
    client.command(
        f"""CREATE TABLE {name} (id String, kind LowCardinality(String), note Nullable(String),
            at DateTime64(3, 'UTC'), attrs Map(String, String), n UInt16,
            latency Nullable(Int64)) ENGINE = MergeTree ORDER BY id"""
    )


def rows(count: int) -> list[list[object]]:
    return [
        [f"e{i:05d}", ("email", "sms")[i % 2], None if i % 3 else f"ü'\t\\{i}",
         NOW + dt.timedelta(milliseconds=i), {"k": str(i), "é": ""} if i % 2 else {}, i,
         None if i % 4 else -i]
        for i in range(count)
    ]  # fmt: skip


def test_ping(dsn: str) -> None:
    with urllib.request.urlopen(f"{dsn}/ping") as resp:
        assert (resp.status, resp.read()) == (200, b"Ok.\n")
    c = get_client(dsn=dsn)
    assert c.ping() is True
    assert c.server_version.startswith("26.")


def test_insert_and_query_round_trip(client: Client) -> None:
    make_table(client, "events")
    data = rows(1000)
    summary = client.insert("events", data, column_names=EVENT_COLUMNS)
    assert summary.written_rows == 1000
    result = client.query("SELECT * FROM events ORDER BY id")
    assert result.column_names == tuple(EVENT_COLUMNS)
    got = [list(r) for r in result.result_rows]
    expected = [[*r[:3], r[3].replace(tzinfo=None), *r[4:]] for r in data]  # naive UTC back
    assert got == expected
    counts = client.query("SELECT kind, count() FROM events GROUP BY kind ORDER BY kind")
    assert counts.result_rows == [("email", 500), ("sms", 500)]


def test_raw_insert_with_the_statement_in_the_body(client: Client) -> None:
    make_table(client, "raw")
    csv = "a,email,,2026-01-01 00:00:00.001,{},1,\nb,sms,x,2026-01-01 00:00:00.002,{'k':'v'},2,5\n"
    client.raw_insert("raw", EVENT_COLUMNS, csv, fmt="CSV")
    got = client.query("SELECT id, note, attrs, latency FROM raw ORDER BY id").result_rows
    assert got == [("a", None, {}, None), ("b", "x", {"k": "v"}, 5)]


def test_command_results(client: Client) -> None:
    assert client.command("SELECT 1") == 1
    assert client.command("SELECT 'a', 2") == ["a", "2"]
    assert client.command("SELECT 1 WHERE 0") == ""
    summary = client.command("CREATE TABLE IF NOT EXISTS c (x UInt8) ENGINE = Memory")
    assert not isinstance(summary, (str, int, list))


def test_server_side_parameters_and_long_ones(client: Client) -> None:
    tricky = "it's\t\\ \n{x} ü"
    assert client.query("SELECT {s:String}", parameters={"s": tricky}).result_rows == [(tricky,)]
    long = "x" * 10_000  # sent as multipart/form-data
    assert client.query("SELECT length({s:String})", parameters={"s": long}).result_rows == [
        (10_000,)
    ]


def test_settings_apply_per_request(client: Client) -> None:
    query = "SELECT getSetting('max_block_size')"
    default = client.query(query).result_rows[0][0]
    assert client.query(query, settings={"max_block_size": 1234}).result_rows == [(1234,)]
    assert client.query(query).result_rows == [(default,)]


def test_error_raises_and_connection_stays_usable(client: Client) -> None:
    with pytest.raises(DatabaseError) as err:
        client.query("SELECT * FROM does_not_exist")
    assert err.value.code == 60  # UNKNOWN_TABLE
    assert "UNKNOWN_TABLE" in str(err.value)
    with pytest.raises(DatabaseError, match="SYNTAX_ERROR"):
        client.command("SELEKT 1")
    with pytest.raises(DatabaseError):
        client.insert("does_not_exist", [[1]], column_names=["x"])
    assert client.command("SELECT 42") == 42


def test_raw_http_headers_and_formats(dsn: str) -> None:
    url = f"{dsn}/?query={quote('SELECT 1 AS a FORMAT JSONEachRow')}&query_id=q-1"
    with urllib.request.urlopen(url) as resp:
        assert resp.read() == b'{"a":1}\n'
        assert resp.headers["X-ClickHouse-Format"] == "JSONEachRow"
        assert resp.headers["X-ClickHouse-Query-Id"] == "q-1"
        assert resp.headers["X-ClickHouse-Timezone"] == "UTC"
        assert resp.headers["X-ClickHouse-Summary"].startswith("{")
    request = urllib.request.Request(dsn, data=b"SELECT nope()", method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request)
    assert err.value.code == 500
    assert err.value.headers["X-ClickHouse-Exception-Code"] == "46"
    assert err.value.read().startswith(b"Code: 46. DB::Exception: ")


def _status(dsn: str, sql: str, method: str = "POST", **headers: str) -> tuple[int, bytes]:
    url = f"{dsn}/?query={quote(sql)}" if method == "GET" else dsn
    data = None if method == "GET" else sql.encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_what_a_web_page_could_send_cannot_write(dsn: str) -> None:
    """GET only reads; a foreign Host (DNS rebinding) or any Origin (a cross-site request from a
    developer's browser) is refused before anything runs."""
    assert _status(dsn, "CREATE TABLE t_get (x UInt8) ENGINE = Memory", "GET")[0] == 500
    assert _status(dsn, "SELECT 1", "GET") == (200, b"1\n")
    evil = _status(dsn, "DROP TABLE IF EXISTS system_t", Host="evil.example:8123")
    assert evil[0] == 403 and evil[1].startswith(b"Code: 497.")
    page = _status(dsn, "DROP TABLE IF EXISTS system_t", Origin="https://evil.example")
    assert page[0] == 403
    assert _status(dsn, "EXISTS TABLE t_get", "GET") == (200, b"0\n")  # nothing was created
    assert _status(dsn, "SELECT 2", Host="localhost:1")[0] == 200


def test_readonly_is_chdbs_own(client: Client) -> None:
    """`readonly=1` runs the statement under chDB's readonly mode, whatever the client appends
    (clickhouse-connect ends every query with FORMAT Native): no write, DDL, table function
    reaching files, nor setting changed by the query; the next request is not readonly."""
    client.command("CREATE TABLE IF NOT EXISTS ro_t (x UInt8) ENGINE = MergeTree ORDER BY x")
    readonly = {"readonly": 1, "max_execution_time": 5}
    assert client.query("SELECT count() FROM ro_t", settings=readonly).result_rows == [(0,)]
    refused = [
        "DROP TABLE ro_t",
        "INSERT INTO ro_t SELECT 1",
        "SELECT * FROM file('/etc/hostname', 'LineAsString')",
        "SELECT 1 SETTINGS max_execution_time = 1000",
    ]
    for sql in refused:
        with (
            pytest.raises(DatabaseError) as err,
            client.query_row_block_stream(sql, settings=readonly) as stream,
        ):
            list(stream)
        assert err.value.code == 164, sql  # READONLY
    assert client.command("EXISTS TABLE ro_t") == 1
    assert client.query("SELECT getSetting('readonly')").result_rows == [(0,)]


def test_one_statement_per_request(client: Client) -> None:
    """chDB would run every `;`-separated statement; ClickHouse's HTTP interface refuses."""
    client.command("CREATE TABLE IF NOT EXISTS multi_t (x UInt8) ENGINE = MergeTree ORDER BY x")
    for sql in ("SELECT 1; DROP TABLE multi_t", "SELECT 1; DROP TABLE multi_t; SELECT 2"):
        with pytest.raises(DatabaseError) as err:
            client.query(sql, settings={"readonly": 1})
        assert err.value.code == 62, sql  # SYNTAX_ERROR
    with pytest.raises(DatabaseError):
        client.command("SELECT 1; DROP TABLE multi_t")
    assert client.command("EXISTS TABLE multi_t") == 1
    assert client.command("SELECT ';' -- a comment; still one statement\n;") == ";"


def test_concurrent_clients(dsn: str) -> None:
    setup = herald_client(ClickHouseSettings(dsn=dsn), database="default")
    setup.command("CREATE DATABASE IF NOT EXISTS t_conc")
    setup.command(
        "CREATE TABLE IF NOT EXISTS t_conc.n (w UInt8, i UInt32) ENGINE = MergeTree ORDER BY w"
    )
    errors: list[BaseException] = []

    def work(w: int) -> None:
        c = herald_client(ClickHouseSettings(dsn=dsn, database="t_conc"))
        try:
            for i in range(20):
                c.insert("n", [[w, i * 10 + j] for j in range(10)], column_names=["w", "i"])
                assert c.query("SELECT count() FROM n WHERE w = {w:UInt8}", parameters={"w": w})
        except BaseException as exc:
            errors.append(exc)
        finally:
            c.close()

    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert setup.command("SELECT count() FROM t_conc.n") == 800


def test_data_dir_has_one_owner_and_survives_restart(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    proc = start_server(data_dir, free_port())
    try:
        c = get_client(dsn=f"http://127.0.0.1:{proc.args[-1]}")  # type: ignore[index]
        c.command("CREATE TABLE keep (x UInt8) ENGINE = MergeTree ORDER BY x")
        c.command("INSERT INTO keep VALUES (7)")
        second = subprocess.run(
            [sys.executable, "-m", "infra.clickhouse_server", "--data-dir", str(data_dir),
             "--port", str(free_port())],
            cwd=REPO, capture_output=True, timeout=60,
        )  # fmt: skip
        assert second.returncode == 2
        assert b"cannot open chDB data directory" in second.stderr
    finally:
        assert stop_server(proc) == 0
    with running_server(data_dir) as url:
        assert get_client(dsn=url).command("SELECT x FROM keep") == 7


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_stops_cleanly(tmp_path: Path, sig: int) -> None:
    port = free_port()
    proc = start_server(tmp_path / "data", port)
    get_client(dsn=f"http://127.0.0.1:{port}").command("SELECT 1")  # a kept-alive connection
    assert stop_server(proc, sig) == 0
    assert proc.poll() is not None
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0  # nothing listens any more
