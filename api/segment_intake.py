"""Members of a segment from an upload body or a query's rows, one at a time, validated.

    FORMATS                                   media type -> parser of a binary stream
    ndjson_members(stream)                    `{"user_id": "u1", "params": {...}}` or `"u1"` a line
    csv_members(stream)                       a header row naming `user_id`; other columns: params
    query_members(names, types, blocks)       rows of a query: user_id, optional params map
                                              (BadColumns for other columns)
    BodyReader(chunks, loop)                  the request body as a file, read from a worker thread

A member is `(user_id, params)`. User ids follow the API's id rule (api.models.ID_PATTERN, 1-128
characters); params hold at most MAX_PARAMS keys of 1-64 characters and values of 2,000. The first
bad member raises BadMember with its line (or row) number and a reason code; nothing is buffered
beyond one line, so an upload of any size is parsed in constant memory.
"""

from __future__ import annotations

import asyncio
import csv
import io
import re
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from typing import Any

import orjson

from api.models import ID_PATTERN, MAX_PARAMS

Member = tuple[str, dict[str, str]]

MAX_LINE_BYTES = 64 * 1024
_ID = re.compile(ID_PATTERN)
_MEMBER_KEYS = frozenset({"user_id", "params"})


class BadColumns(ValueError):
    """A query whose columns are not `user_id[, params]`."""


class BadMember(Exception):
    """A line or row that is not a member: `reason` is a code, `msg` names no value."""

    def __init__(self, where: int, reason: str, msg: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where = where
        self.reason = reason
        self.msg = msg


def checked_user(user: object, where: int) -> str:
    """`user` as an id, or BadMember `invalid_user_id`."""
    if not isinstance(user, str) or not 1 <= len(user) <= 128 or not _ID.fullmatch(user):
        raise BadMember(where, "invalid_user_id", "user_id must be 1-128 printable ASCII "
                        "characters without spaces or braces")  # fmt: skip
    return user


def checked_params(params: object, where: int) -> dict[str, str]:
    """`params` as a str -> str map within the API's limits, or BadMember `invalid_params`."""
    if params is None:
        return {}
    ok = isinstance(params, dict) and len(params) <= MAX_PARAMS
    if isinstance(params, dict) and ok:
        ok = all(
            isinstance(key, str) and 1 <= len(key) <= 64 and isinstance(value, str)
            and len(value) <= 2000
            for key, value in params.items()
        )  # fmt: skip
    if not ok:
        raise BadMember(where, "invalid_params", f"params must map at most {MAX_PARAMS} names "
                        "(1-64 characters) to strings of at most 2000 characters")  # fmt: skip
    return params  # type: ignore[return-value]


def _lines(stream: io.BufferedIOBase) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of a binary stream, each at most MAX_LINE_BYTES."""
    number = 0
    while line := stream.readline(MAX_LINE_BYTES + 1):
        number += 1
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            raise BadMember(number, "line_too_long", f"lines are at most {MAX_LINE_BYTES} bytes")
        yield number, line


def ndjson_members(stream: io.BufferedIOBase) -> Iterator[Member]:
    """One member per non-blank line: a JSON string (the user id) or an object with `user_id`
    and optional `params`."""
    for number, line in _lines(stream):
        if not line.strip():
            continue
        try:
            item = orjson.loads(line)
        except orjson.JSONDecodeError:
            raise BadMember(number, "malformed_json", "the line is not one JSON value") from None
        if isinstance(item, str):
            yield checked_user(item, number), {}
        elif isinstance(item, dict) and "user_id" in item and set(item) <= _MEMBER_KEYS:
            yield checked_user(item["user_id"], number), checked_params(item.get("params"), number)
        else:
            raise BadMember(number, "invalid_member", 'a line is "<user_id>" or '
                            '{"user_id": ..., "params": {...}}')  # fmt: skip


def csv_members(stream: io.BufferedIOBase) -> Iterator[Member]:
    """One member per record after the header; the header names `user_id` and the params'
    columns (an empty cell gives no param)."""
    text = io.TextIOWrapper(stream, encoding="utf-8-sig", newline="")  # type: ignore[type-var, arg-type]
    reader = csv.reader(_text_lines(text), strict=True)
    try:
        header = next(reader, None)
        columns = _header(header)
        for record in reader:
            if not record:
                continue
            if len(record) != len(columns):
                raise BadMember(reader.line_num, "wrong_field_count",
                                f"the header has {len(columns)} fields")  # fmt: skip
            params = {name: value for name, value in zip(columns, record, strict=True) if value}
            user = params.pop("user_id", None)
            yield checked_user(user, reader.line_num), checked_params(params, reader.line_num)
    except csv.Error as exc:
        raise BadMember(reader.line_num, "malformed_csv", str(exc)) from None
    except UnicodeDecodeError:
        raise BadMember(reader.line_num + 1, "invalid_utf8", "the body is not UTF-8") from None


def _text_lines(text: io.TextIOBase) -> Iterator[str]:
    number = 0
    while line := text.readline(MAX_LINE_BYTES + 1):
        number += 1
        if len(line) > MAX_LINE_BYTES and not line.endswith(("\n", "\r")):
            raise BadMember(number, "line_too_long", f"lines are at most {MAX_LINE_BYTES} bytes")
        yield line


def _header(header: list[str] | None) -> list[str]:
    if header is None:
        return ["user_id"]  # an empty body: no member
    names = [name.strip() for name in header]
    fine = (
        "user_id" in names
        and len(set(names)) == len(names)
        and len(names) <= MAX_PARAMS + 1
        and all(1 <= len(name) <= 64 for name in names)
    )
    if not fine:
        raise BadMember(1, "invalid_header", f"the header names user_id and at most {MAX_PARAMS} "
                        "distinct params of 1-64 characters")  # fmt: skip
    return names


FORMATS: dict[str, Callable[[io.BufferedIOBase], Iterator[Member]]] = {
    "application/x-ndjson": ndjson_members,
    "text/csv": csv_members,
}


def query_members(
    names: Sequence[str], types: Sequence[str], blocks: Iterable[Sequence[Sequence[Any]]]
) -> Iterator[Member]:
    """Members from a query's row blocks: column 1 the user id (a string or integer type),
    optional column 2 a Map(String, String) of params. BadColumns for other shapes."""
    if not 1 <= len(names) <= 2 or (len(names) == 2 and not types[1].startswith("Map(")):
        raise BadColumns(
            "the query must return user_id, optionally followed by params Map(String, String); "
            f"it returns {len(names)} column(s): {', '.join(types)}"
        )
    number = 0
    for block in blocks:
        for row in block:
            number += 1
            user = row[0] if isinstance(row[0], str) else _id_text(row[0])
            params = row[1] if len(row) > 1 else None
            yield checked_user(user, number), checked_params(params or None, number)


def _id_text(value: object) -> object:
    """An integer, UUID or FixedString id as text; anything else unchanged (then refused)."""
    if isinstance(value, uuid.UUID) or (isinstance(value, int) and not isinstance(value, bool)):
        return str(value)
    if isinstance(value, bytes):
        return value.rstrip(b"\0").decode("utf-8", "replace")
    return value


class BodyReader(io.RawIOBase):
    """The request body as a binary file for a worker thread: each read that finds no data
    left asks the event loop (`loop`) for the next chunk of `chunks`, so the body is read only
    as fast as it is parsed. A chunk that takes more than `idle_seconds` ends the read with
    TimeoutError; the client going away raises what the stream raised (ClientDisconnect)."""

    def __init__(
        self, chunks: AsyncIterator[bytes], loop: asyncio.AbstractEventLoop, idle_seconds: float
    ) -> None:
        super().__init__()
        self._chunks = chunks
        self._loop = loop
        self._idle = idle_seconds
        self._pending = memoryview(b"")
        self._eof = False
        self.received = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending and not self._eof:
            future = asyncio.run_coroutine_threadsafe(self._next(), self._loop)
            try:
                chunk = future.result(self._idle)
            except TimeoutError:
                future.cancel()
                raise
            self._eof = chunk is None
            self._pending = memoryview(chunk or b"")
            self.received += len(self._pending)
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    async def _next(self) -> bytes | None:
        try:
            return await anext(self._chunks)
        except StopAsyncIteration:
            return None
