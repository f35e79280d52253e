"""The embedded ClickHouse service: one process owns chDB and speaks ClickHouse's HTTP interface.

Why this process exists
    chDB (ClickHouse 26 in-process) allows exactly one process per data directory (it locks the
    directory). Herald has many processes that need ClickHouse (Bytewax jobs, the API,
    dashboards, the CLI, tests). So in the embedded stack ONE process, the `clickhouse` service
    started by the launcher, opens the data directory and serves the part of ClickHouse's HTTP
    interface that clickhouse-connect's HttpClient uses. Every other process uses the ordinary
    client (`herald.clickhouse.herald_client`, i.e. `clickhouse_connect.get_client(dsn=...)`)
    exactly as in production against a real server: no code path differs between embedded and
    production, and nothing but this process ever opens chDB.

Run: `python -m infra.clickhouse_server --data-dir PATH --host 127.0.0.1 --port 8123`; ready
when `GET /ping` answers 200 `Ok.`. SIGTERM/SIGINT finish the running statement, close the
session, exit 0. Exit 2: the data directory is owned by another process, or the port is taken.

Protocol served (ClickHouse "HTTP Interface")
    GET /ping, GET /          -> 200 "Ok.\\n"
    GET|POST /?query=SQL      -> SQL is the `query` parameter followed by the body, if any;
                                 POST / with only a body: the body is the SQL
    INSERT ... FORMAT F       -> the statement (in `query` or at the head of the body) and its
                                 data (the body) are streamed into chDB's `send_insert`
    URL parameters: `database`, `default_format`, `query_id`, `param_NAME` (server-side binding
    of `{NAME:Type}`), `readonly`; other non-transport parameters are ClickHouse settings.
    One statement per request, as ClickHouse (chDB alone would run every `;`-separated one).
    `readonly=1` (and every GET) runs the statement with chDB's own `SETTINGS readonly = 1`:
    only a reading statement (SELECT, WITH, SHOW, ...), no table functions reaching files or
    the network, no SETTINGS clause (chDB still takes one on a subquery, ClickHouse does not).
    multipart/form-data bodies carry `query` and `param_*` fields (long bind parameters).
    Responses carry X-ClickHouse-Query-Id, -Format (statements with a result set), -Timezone,
    -Summary, -Server-Display-Name; errors are HTTP 500 (400: malformed request) with
    `Code: N. DB::Exception: ...` and X-ClickHouse-Exception-Code, so the client raises
    DatabaseError carrying the code.

Limits (deliberate: this serves one machine on loopback)
    - One chDB session: statements run one at a time under a lock.
    - Results are built in memory before being sent; request bodies are read whole.
    - Request bodies may be lz4/zstd/gzip/deflate encoded (the client compresses inserts by
      default); responses are never compressed; `decompress=1` (native blocks) is refused.
    - `session_id` is ignored: all clients share the session, so SET/USE statements and
      temporary tables are visible to all. Per-request settings are applied with SET and reset
      with `SET name = DEFAULT` when a later request no longer sends them.
    - No users, passwords or TLS (bind to loopback), no external-data tables. What a web page
      in a developer's browser could send is refused with 403 (ACCESS_DENIED): a Host header
      not naming this server (loopback names or the bind address: DNS rebinding) and any
      request carrying an Origin header; a GET only reads (readonly, as ClickHouse does).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import json
import logging
import os
import re
import signal
import threading
import uuid
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import lz4.frame
from backports import zstd

from herald.errors import InfraError
from infra.sqltext import split_statements

log = logging.getLogger(__name__)

DISPLAY_NAME = "herald-chdb"
# ClickHouse error codes for errors raised by this facade itself.
BAD_ARGUMENTS, NOT_IMPLEMENTED, SYNTAX_ERROR, READONLY = 36, 48, 62, 164
ABORTED, ACCESS_DENIED = 236, 497
CANNOT_DECOMPRESS, UNKNOWN_COMPRESSION_METHOD, STD_EXCEPTION = 271, 638, 1001

# URL parameters that steer the transport; never forwarded as settings (nor are `http_*`).
_TRANSPORT_PARAMS = frozenset((
    "query", "database", "default_format", "query_id", "session_id", "session_timeout",
    "session_check", "compress", "decompress", "client_protocol_version", "buffer_size",
    "wait_end_of_query", "role", "quota_key", "user", "password", "readonly",
    "enable_http_compression", "send_progress_in_http_headers",
    "cancel_http_readonly_queries_on_client_close",
))  # fmt: skip
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER_RE = re.compile(r"-?\d+(\.\d+)?")
_CODE_RE = re.compile(r"Code: (\d+)\.")
_TRAILING_FORMAT_RE = re.compile(r"\bFORMAT\s+(\w+)\s*;?\s*$", re.IGNORECASE)
_LEADING_NOISE_RE = re.compile(r"\A(?:\s+|--[^\n]*(?:\n|\Z)|/\*.*?\*/)*", re.DOTALL)
_RESULT_KEYWORDS = ("SELECT", "WITH", "SHOW", "DESC", "EXISTS", "EXPLAIN", "CHECK", "(")
# `INSERT INTO <target> FORMAT <fmt>`, one optional line break, then the data.
_DATA_INSERT_RE = re.compile(
    rb"\A\s*INSERT\s+INTO\s+(?P<target>(?:[^'`\"]|'(?:[^'\\]|\\.)*'|`[^`]*`|\"[^\"]*\")+?)"
    rb"\s+FORMAT\s+(?P<fmt>\w+)[ \t]*(?:\r?\n)?",
    re.IGNORECASE | re.DOTALL,
)
_QUOTED_RE = re.compile(rb"'(?:[^'\\]|\\.)*'|`[^`]*`|\"[^\"]*\"")
_INLINE_DATA_RE = re.compile(rb"\b(?:VALUES|SELECT|WITH)\b", re.IGNORECASE)
_TEXT_FORMATS = ("TabSeparated", "TSV", "CSV", "JSON", "Pretty", "Values", "Vertical")


class ClickHouseError(Exception):
    """An error reported to the client as ClickHouse does: `Code: N. DB::Exception: ...`."""

    def __init__(self, code: int, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.code = code
        self.status = status

    @classmethod
    def from_engine(cls, exc: BaseException) -> ClickHouseError:
        """Wrap a chDB exception, whose text already is `Code: N. DB::Exception: ...`."""
        match = _CODE_RE.search(str(exc))
        return cls(int(match.group(1)) if match else STD_EXCEPTION, str(exc))

    def body(self, version: str) -> bytes:
        """The response body ClickHouse would send for this error."""
        text = str(self)
        if not text.startswith("Code: "):
            text = f"Code: {self.code}. DB::Exception: {text}"
        return f"{text} (version {version} (chDB))\n".encode()


@dataclass(frozen=True)
class Statement:
    """One decoded request: SQL (or an INSERT head plus its data) and its context."""

    sql: str
    data: bytes | None = None  # set for `INSERT ... FORMAT data_format` with its data
    data_format: str = ""
    database: str = "default"
    default_format: str = "TabSeparated"
    readonly: bool = False
    settings: Mapping[str, str] = field(default_factory=dict)
    params: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Outcome:
    """What a statement produced: body, output format (None: no result set), summary."""

    body: bytes
    fmt: str | None
    summary: dict[str, str]


def parse_statement(params: Mapping[str, str], body: bytes) -> Statement:
    """Turn URL parameters and a decompressed body into a Statement, as ClickHouse does."""
    settings = {k: v for k, v in params.items() if _is_setting(k)}
    context: dict[str, Any] = {
        "database": params.get("database") or "default",
        "default_format": params.get("default_format") or "TabSeparated",
        "readonly": params.get("readonly", "0") not in ("", "0"),
        "settings": settings,
        "params": {k[len("param_") :]: v for k, v in params.items() if k.startswith("param_")},
    }
    query = params.get("query", "")
    if query:
        insert = _data_insert(query.encode())
        if insert:
            return _insert_statement(insert, body, context)
        return Statement(sql=f"{query}\n{_text(body)}" if body else query, **context)
    insert = _data_insert(body[:16384])
    if insert:
        return _insert_statement(insert, body[insert.end() :], context)
    return Statement(sql=_text(body), **context)


def _is_setting(name: str) -> bool:
    if name in _TRANSPORT_PARAMS or name.startswith(("param_", "http_")):
        return False
    if not _NAME_RE.fullmatch(name):
        raise ClickHouseError(BAD_ARGUMENTS, f"Invalid setting name {name!r}", 400)
    return True


def _data_insert(head: bytes) -> re.Match[bytes] | None:
    """The `INSERT INTO target FORMAT fmt` head of a data insert (not INSERT VALUES/SELECT)."""
    match = _DATA_INSERT_RE.match(head)
    if match and not _INLINE_DATA_RE.search(_QUOTED_RE.sub(b"", match.group("target"))):
        return match
    return None


def _insert_statement(insert: re.Match[bytes], data: bytes, context: dict[str, Any]) -> Statement:
    sql, fmt = f"INSERT INTO {_text(insert.group('target'))}", _text(insert.group("fmt"))
    return Statement(sql=sql, data=data, data_format=fmt, **context)


def _text(raw: bytes) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise ClickHouseError(BAD_ARGUMENTS, f"Query is not valid UTF-8: {exc}", 400) from None


def result_format(sql: str, default_format: str) -> str | None:
    """The output format of `sql`, or None when the statement produces no result set."""
    match = _TRAILING_FORMAT_RE.search(sql)
    if match:
        return match.group(1)
    head = _LEADING_NOISE_RE.sub("", sql, count=1)[:16].upper()
    return default_format if head.startswith(_RESULT_KEYWORDS) else None


def single_statement(sql: str, *, readonly: bool) -> str:
    """`sql` as chDB should run it: one statement (SYNTAX_ERROR for several, as ClickHouse's
    HTTP interface answers), and with `readonly` a reading one (READONLY otherwise) carrying
    `SETTINGS readonly = 1` before its FORMAT, so chDB itself refuses writes, table functions
    and the query's own SETTINGS."""
    if ";" in sql:
        statements = split_statements(sql)
        if len(statements) > 1:
            raise ClickHouseError(
                SYNTAX_ERROR, "Syntax error (Multi-statements are not allowed). (SYNTAX_ERROR)", 400
            )
        sql = statements[0] if statements else sql
    if not readonly:
        return sql
    if result_format(_TRAILING_FORMAT_RE.sub("", sql), "") is None:
        raise ClickHouseError(READONLY, "Cannot execute query in readonly mode. (READONLY)")
    fmt = _TRAILING_FORMAT_RE.search(sql)
    at = fmt.start() if fmt else len(sql)
    return f"{sql[:at]}\nSETTINGS readonly = 1\n{sql[at:]}"


def _literal(value: str) -> str:
    if _NUMBER_RE.fullmatch(value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class ChdbEngine:
    """The one chDB session of this process; every statement runs under its lock.

    Opening raises InfraError when another process holds the data directory.
    """

    def __init__(self, data_dir: Path) -> None:
        try:
            import chdb  # here, not at import time: nothing but this service ever loads chDB
        except ImportError as exc:
            raise InfraError(
                "chdb is not installed: run `make install`, or pip install 'herald[embedded]'"
            ) from exc

        data_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._conn: Any = chdb.connect(str(data_dir))
        except Exception as exc:
            raise InfraError(f"cannot open chDB data directory {data_dir}: {exc}") from exc
        self._lock = threading.Lock()
        self._database: str | None = None  # None: unknown, USE before the next statement
        self._settings: dict[str, str] = {}  # settings currently SET on the session
        row = self._conn.query("SELECT version(), timezone()", "TabSeparated").bytes()
        self.version, self.timezone = row.decode().strip().split("\t")

    def execute(self, stmt: Statement) -> Outcome:
        """Run one statement in its database with its settings; raise ClickHouseError."""
        if stmt.data is None:
            stmt = replace(stmt, sql=single_statement(stmt.sql, readonly=stmt.readonly))
        elif stmt.readonly:
            raise ClickHouseError(READONLY, "Cannot execute query in readonly mode. (READONLY)")
        with self._lock:
            if self._conn is None:
                raise ClickHouseError(ABORTED, "Server is shutting down", 503)
            try:
                self._prepare(stmt)
                return self._insert(stmt) if stmt.data is not None else self._query(stmt)
            except ClickHouseError:
                raise
            except Exception as exc:
                raise ClickHouseError.from_engine(exc) from None

    def _prepare(self, stmt: Statement) -> None:
        if stmt.database != self._database:
            self._database = None
            self._conn.query(f"USE `{stmt.database.replace('`', '')}`", "TabSeparated")
            self._database = stmt.database
        for name in [n for n in self._settings if n not in stmt.settings]:
            self._conn.query(f"SET {name} = DEFAULT", "TabSeparated")
            del self._settings[name]
        for name, value in stmt.settings.items():
            if self._settings.get(name) != value:
                self._settings.pop(name, None)
                self._conn.query(f"SET {name} = {_literal(value)}", "TabSeparated")
                self._settings[name] = value

    def _query(self, stmt: Statement) -> Outcome:
        fmt = result_format(stmt.sql, stmt.default_format)
        result = self._conn.query(stmt.sql, fmt or stmt.default_format, params=dict(stmt.params))
        if re.match(r"USE\b", _LEADING_NOISE_RE.sub("", stmt.sql, count=1), re.IGNORECASE):
            self._database = None  # the statement moved the shared session
        stats = (result.storage_rows_read(), result.storage_bytes_read(), result.rows_written())
        more = (result.bytes_written(), result.rows_read(), result.bytes_read(), result.elapsed())
        return Outcome(result.bytes() or b"", fmt, _summary(*stats, *more))

    def _insert(self, stmt: Statement) -> Outcome:
        assert stmt.data is not None
        inserter = self._conn.send_insert(stmt.sql, stmt.data_format)
        try:
            view = memoryview(stmt.data)
            for start in range(0, len(view), 8 << 20):
                inserter.append(view[start : start + (8 << 20)])
            done = inserter.finish()
        except BaseException:
            with contextlib.suppress(Exception):
                inserter.cancel()
            raise
        rows, size = done.rows_written, done.bytes_written
        return Outcome(b"", None, _summary(rows, len(stmt.data), rows, size, 0, 0, done.elapsed))

    def close(self) -> None:
        """Wait for the running statement, then close the session. Idempotent."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def _summary(
    read_rows: int, read_bytes: int, written_rows: int, written_bytes: int,
    result_rows: int, result_bytes: int, elapsed: float,
) -> dict[str, str]:  # fmt: skip
    """X-ClickHouse-Summary: ClickHouse sends every figure as a string."""
    return {
        "read_rows": str(read_rows), "read_bytes": str(read_bytes),
        "written_rows": str(written_rows), "written_bytes": str(written_bytes),
        "total_rows_to_read": str(read_rows), "result_rows": str(result_rows),
        "result_bytes": str(result_bytes), "elapsed_ns": str(int(elapsed * 1e9)),
    }  # fmt: skip


def decompress(data: bytes, encoding: str) -> bytes:
    """Decode a request body sent with Content-Encoding `encoding` (possibly several frames)."""
    encoding = encoding.strip().lower()
    try:
        if encoding in ("", "identity"):
            return data
        if encoding == "gzip":
            return gzip.decompress(data)
        if encoding == "deflate":
            return zlib.decompress(data)
        if encoding == "zstd":
            return zstd.decompress(data)
        if encoding == "lz4":
            out: list[bytes] = []
            while data:  # clickhouse-connect sends one LZ4 frame per block
                frames = lz4.frame.LZ4FrameDecompressor()
                out.append(frames.decompress(data))
                data = frames.unused_data if frames.eof else b""
            return b"".join(out)
    except Exception as exc:
        message = f"Cannot decode {encoding} body: {exc}"
        raise ClickHouseError(CANNOT_DECOMPRESS, message, 400) from None
    raise ClickHouseError(UNKNOWN_COMPRESSION_METHOD, f"Unknown Content-Encoding {encoding!r}", 400)


def read_chunked(rfile: io.BufferedIOBase) -> bytes:
    """Read a `Transfer-Encoding: chunked` body (clickhouse-connect streams inserts so)."""
    parts: list[bytes] = []
    while True:
        line = rfile.readline(65537)
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise ClickHouseError(BAD_ARGUMENTS, "Malformed chunked body", 400) from None
        if size == 0:
            while rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(parts)
        parts.append(rfile.read(size))
        rfile.readline(65537)  # the CRLF closing the chunk


def parse_form(content_type: str, body: bytes) -> dict[str, str]:
    """The fields of a multipart/form-data body; file fields (external data) are refused."""
    from email.parser import BytesParser
    from email.policy import HTTP

    message = BytesParser(policy=HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + body
    )
    fields: dict[str, str] = {}
    for part in message.iter_parts():
        if part.get_filename():
            raise ClickHouseError(NOT_IMPLEMENTED, "External data tables are not supported", 400)
        payload = part.get_payload(decode=True)
        name = part.get_param("name", header="content-disposition")
        fields[str(name)] = _text(payload if isinstance(payload, bytes) else b"")
    return fields


class _Handler(BaseHTTPRequestHandler):
    """One HTTP/1.1 keep-alive connection; its requests run one after the other."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are separate writes: avoid 40 ms stalls
    server: ClickHouseHTTPServer

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        self._serve(with_body=False)

    def do_POST(self) -> None:  # noqa: N802
        self._serve(with_body=True)

    def _serve(self, *, with_body: bool) -> None:
        query_id = str(uuid.uuid4())
        try:
            body = self._read_body() if with_body else b""
            url = urlsplit(self.path)
            params = dict(parse_qsl(url.query, keep_blank_values=True))
            query_id = params.get("query_id") or query_id
            if url.path == "/ping" or (url.path == "/" and not url.query and not body):
                self._reply(200, b"Ok.\n", {"Content-Type": "text/plain; charset=UTF-8"})
                return
            self._check_caller()
            if url.path != "/":
                raise ClickHouseError(NOT_IMPLEMENTED, f"No handler for {url.path}", 404)
            if not with_body:
                params["readonly"] = "1"  # as ClickHouse: a GET only reads
            outcome = self.server.engine.execute(self._statement(params, body))
        except ClickHouseError as exc:
            self._reply_error(exc, query_id)
        except Exception as exc:
            log.exception("clickhouse.request_failed")
            self._reply_error(ClickHouseError(STD_EXCEPTION, repr(exc)), query_id)
        else:
            self._reply_outcome(outcome, query_id)

    def _check_caller(self) -> None:
        """Refuse what a web page could send: a Host other than this server's names (DNS
        rebinding) or any Origin (browsers send it cross-site; ClickHouse clients never do)."""
        host = _host_name(self.headers.get("Host", ""))
        if host not in self.server.allowed_hosts:
            raise ClickHouseError(ACCESS_DENIED, f"Host {host!r} is not this server's", 403)
        if self.headers.get("Origin") is not None:
            raise ClickHouseError(ACCESS_DENIED, "requests from web pages are refused", 403)

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return read_chunked(self.rfile)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _statement(self, params: dict[str, str], body: bytes) -> Statement:
        if params.get("decompress", "0") not in ("", "0"):
            raise ClickHouseError(NOT_IMPLEMENTED, "decompress=1 is not supported", 400)
        body = decompress(body, self.headers.get("Content-Encoding", ""))
        content_type = self.headers.get("Content-Type", "")
        if content_type.startswith("multipart/form-data"):
            params.update(parse_form(content_type, body))
            body = b""
        return parse_statement(params, body)

    def _reply_outcome(self, outcome: Outcome, query_id: str) -> None:
        headers = self._common_headers(query_id)
        headers["X-ClickHouse-Summary"] = json.dumps(outcome.summary, separators=(",", ":"))
        text = outcome.fmt is None or outcome.fmt.startswith(_TEXT_FORMATS)
        headers["Content-Type"] = (
            "text/plain; charset=UTF-8" if text else "application/octet-stream"
        )
        if outcome.fmt is not None:
            headers["X-ClickHouse-Format"] = outcome.fmt
        self._reply(200, outcome.body, headers)

    def _reply_error(self, exc: ClickHouseError, query_id: str) -> None:
        log.info("clickhouse.query_failed code=%s status=%s", exc.code, exc.status)
        headers = self._common_headers(query_id)
        headers["X-ClickHouse-Exception-Code"] = str(exc.code)
        headers["Content-Type"] = "text/plain; charset=UTF-8"
        if exc.status == 400:  # the body may not have been consumed in full: close, and say so
            headers["Connection"] = "close"  # (a client would reuse the closed connection)
            self.close_connection = True
        self._reply(exc.status, exc.body(self.server.engine.version), headers)

    def _common_headers(self, query_id: str) -> dict[str, str]:
        return {
            "X-ClickHouse-Query-Id": query_id,
            "X-ClickHouse-Timezone": self.server.engine.timezone,
            "X-ClickHouse-Server-Display-Name": DISPLAY_NAME,
        }

    def _reply(self, status: int, body: bytes, headers: Mapping[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib signature)
        log.debug("clickhouse.http " + format, *args)


class ClickHouseHTTPServer(ThreadingHTTPServer):
    """A thread per connection in front of one ChdbEngine."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], engine: ChdbEngine) -> None:
        self.engine = engine
        self.allowed_hosts = _LOOPBACK_NAMES | {_host_name(address[0])}
        super().__init__(address, _Handler)


_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def _host_name(host: str) -> str:
    """The name of a Host header or bind address, without port and IPv6 brackets."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def serve(data_dir: Path, host: str, port: int) -> None:
    """Open chDB on `data_dir`, serve HTTP on host:port until SIGTERM/SIGINT, then close."""
    engine = ChdbEngine(data_dir)
    try:
        server = ClickHouseHTTPServer((host, port), engine)
    except OSError as exc:
        engine.close()
        raise InfraError(f"cannot listen on {host}:{port}: {exc}") from exc
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    threading.Thread(target=server.serve_forever, args=(0.2,), daemon=True).start()
    log.info("clickhouse.listening host=%s port=%s data_dir=%s version=%s",
             host, server.server_address[1], data_dir, engine.version)  # fmt: skip
    while not stop.wait(0.5):
        pass
    log.info("clickhouse.stopping")
    server.shutdown()
    server.server_close()
    engine.close()
    log.info("clickhouse.stopped")


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m infra.clickhouse_server`; returns the exit code."""
    parser = argparse.ArgumentParser(description="Serve an embedded ClickHouse (chDB) over HTTP.")
    parser.add_argument("--data-dir", type=Path, required=True, help="chDB data directory")
    parser.add_argument("--host", default="127.0.0.1", help="listen address (keep loopback)")
    parser.add_argument("--port", type=int, default=8123, help="listen port")
    parser.add_argument("--timezone", default="UTC", help="server timezone, as in production")
    parser.add_argument("--log-level", default="INFO", help="DEBUG logs every request")
    args = parser.parse_args(argv)
    os.environ["TZ"] = args.timezone  # read by chDB when it loads, not the machine's zone
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    try:
        serve(args.data_dir, args.host, args.port)
    except InfraError as exc:
        log.error("clickhouse.failed error=%s", exc)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
