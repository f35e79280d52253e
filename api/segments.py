"""Segments: audience snapshots a tenant creates through the API (api/routes/segments.py).

    create(st, tenant, segment_id, source, fill)    claim the id, fill its members, register it
    upload_fill(store, segment_id, parse, reader)   members of an upload body (api/segment_intake)
    query_fill(store, segment_id, sql, timeout)     members of a read-only query's rows
    visible(st, tenant, segment_id)                 the tenant's segment, or 404
    delete(st, tenant, segment_id)                  unregister it and delete its members
    check_segment(st, tenant_id, segment_id)        may a campaign of the tenant target it?

Members live in `segment_members` (migration 0008), read by the plan job in user_id pages; the
registry `segments` (0010) says who owns an id and whether it may be targeted. Segment ids are
one namespace for all tenants (the plan job reads a request's bare segment_id), so an id once
registered belongs to its tenant: another tenant's create is 409 `segment_exists` like the
owner's (it reveals only that the id is taken), while reads and campaigns answer 404
`segment_not_found` for it, as for an id that does not exist.

Lifecycle of an id (a registry row per change, the highest version wins):

    unregistered --create--> claimed (deleted=1) --members, size--> ready (deleted=0)
    ready --DELETE--> deleted (deleted=1, members deleted)
    claimed, the fill failed --> members deleted, the claim stays (the owner may create again)

Creating takes the Redis lock `keys.segment_lock(segment_id)` (409 `segment_in_progress` while
another create holds it), kept alive while the fill runs. A snapshot is immutable: a ready id
is 409 `segment_exists` until deleted; an id with members but no registry row (written by
dataflows/plan/audience.load_segment) is 409 too, and stays targetable by every tenant.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import itertools
import logging
import re
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from typing import Any

from clickhouse_connect.driver.exceptions import ClickHouseError, OperationalError
from redis.exceptions import LockError, RedisError

from api.auth import Tenant
from api.problems import ProblemError
from api.segment_intake import BadColumns, BadMember, BodyReader, Member, query_members
from api.segment_store import (
    Segment,
    SegmentRow,
    SegmentStore,
    Source,
    clickhouse_unavailable,
    now_us,
)
from api.state import AppState, check_segment_allowed, now_utc, redis_unavailable
from herald import keys

log = logging.getLogger(__name__)

Block = Sequence[Sequence[Any]]  # a block of a query's rows
LOCK_TTL_S = 60  # the create lock's TTL, renewed every third of it while the fill runs
_SERVER_MESSAGE = re.compile(r"server response: (.*?)(?: \(for url [^)]*\))?\s*$", re.DOTALL)


class QueryFailed(Exception):
    """ClickHouse refused or aborted a segment's query (not the inserts)."""


async def create(
    st: AppState, tenant: Tenant, segment_id: str, source: Source, fill: Callable[[], int]
) -> Segment:
    """Claim `segment_id` for `tenant`, run `fill` (inserts the members, returns their rows) in
    an ingest thread, count them and register the ready segment. Any failure deletes the
    members written; an empty fill is 422 `empty_segment`."""
    check_segment_allowed(st, tenant, segment_id)
    store = st.segments
    async with _create_lock(st, segment_id):
        current = await store.run(store.find, segment_id)
        if await _taken(store, tenant, segment_id, current):
            raise ProblemError(
                409, "segment_exists", "this segment_id is taken: a segment is an immutable "
                "snapshot, create a new segment_id (or delete this one first)",
            )  # fmt: skip
        version = max(now_us(), current.version + 1 if current else 0)
        now = now_utc()  # stored in ms (DateTime64(3)): the answer shows what a GET will
        now = now.replace(microsecond=now.microsecond // 1000 * 1000)
        claim = SegmentRow(tenant.tenant_id, segment_id, 0, source, now, True, version)
        await store.run(store.write, claim)
        if current is not None:  # the members of a deleted segment or of a failed fill
            await store.run(store.discard, segment_id)
        try:
            ready = await _fill(st, store, claim, fill)
        except BaseException:
            await _discard(store, segment_id)
            raise
    log.info("api.segment_created source=%s size=%d", source, ready.size)
    return ready.view()


async def _taken(
    store: SegmentStore, tenant: Tenant, segment_id: str, current: SegmentRow | None
) -> bool:
    if current is None:
        return await store.run(store.has_members, segment_id)
    return not current.deleted or current.tenant_id != tenant.tenant_id


async def _fill(
    st: AppState, store: SegmentStore, claim: SegmentRow, fill: Callable[[], int]
) -> SegmentRow:
    try:
        rows = await store.ingest(fill)
    except ClickHouseError as exc:
        raise clickhouse_unavailable(exc) from exc
    if rows == 0:
        raise ProblemError(422, "empty_segment", "the segment has no member")
    size = await store.run(store.size, claim.segment_id)
    ready = claim.next(size=size, deleted=False)
    await store.run(store.write, ready)
    return ready


async def _discard(store: SegmentStore, segment_id: str) -> None:
    """Delete the members of a failed fill (its claim keeps the id from being targeted)."""
    try:
        await asyncio.to_thread(store.discard, segment_id)
    except ClickHouseError as exc:
        log.error("api.segment_discard_failed error=%s", type(exc).__name__)


@contextlib.asynccontextmanager
async def _create_lock(st: AppState, segment_id: str) -> AsyncIterator[None]:
    """Hold `keys.segment_lock(segment_id)` while the block runs, renewing it."""
    lock = st.redis.lock(keys.segment_lock(segment_id), timeout=LOCK_TTL_S, blocking=False)
    try:
        held = await lock.acquire()
    except RedisError as exc:
        raise redis_unavailable(st, exc) from exc
    if not held:
        raise ProblemError(409, "segment_in_progress", "this segment is being created",
                           headers={"Retry-After": "5"})  # fmt: skip

    async def renew() -> None:
        while True:
            await asyncio.sleep(LOCK_TTL_S / 3)
            await lock.reacquire()

    renewer = asyncio.create_task(renew())
    try:
        yield
    finally:
        renewer.cancel()
        with contextlib.suppress(LockError, RedisError):
            await lock.release()


def _insert_chunks(
    store: SegmentStore, segment_id: str, members: Iterator[Member], rows: int
) -> int:
    """Insert `members` `rows` at a time; returns the rows inserted."""
    total = 0
    while chunk := list(itertools.islice(members, rows)):
        total += store.insert_members(segment_id, chunk)
    return total


def upload_fill(
    store: SegmentStore, segment_id: str, parse: Callable[[io.BufferedIOBase], Iterator[Member]],
    reader: BodyReader, rows: int,
) -> Callable[[], int]:  # fmt: skip
    """The fill of an upload: parse the body as it arrives; a bad line is 422 `invalid_line`
    with its `line` number."""

    def fill() -> int:
        try:
            members = parse(io.BufferedReader(reader, 64 * 1024))
            return _insert_chunks(store, segment_id, members, rows)
        except BadMember as bad:
            raise _bad_member("line", bad) from None

    return fill


def query_fill(
    store: SegmentStore, segment_id: str, sql: str, timeout_s: int, rows: int
) -> Callable[[], int]:
    """The fill of a query: run `sql` read-only (readonly=1, max_execution_time `timeout_s`)
    and insert its rows as they stream; ClickHouse's refusal is 422 `invalid_query` with its
    message, a bad row 422 `invalid_row` with its `row` number."""
    settings = {"readonly": 1, "max_execution_time": timeout_s}

    def fill() -> int:
        try:
            context = store.client().query_row_block_stream(sql, settings=settings)
        except OperationalError:
            raise  # ClickHouse unreachable: 503
        except ClickHouseError as exc:
            raise _invalid_query(exc) from None
        try:
            with context as stream:
                names = list(stream.source.column_names)
                types = [t.name for t in stream.source.column_types]
                members = query_members(names, types, _query_blocks(stream))
                return _insert_chunks(store, segment_id, members, rows)
        except QueryFailed as exc:
            raise _invalid_query(exc.__cause__ or exc) from None
        except BadColumns as exc:
            raise ProblemError(422, "invalid_query", str(exc)) from None
        except BadMember as bad:
            raise _bad_member("row", bad) from None

    return fill


def _query_blocks(stream: Iterable[Block]) -> Iterator[Block]:
    """The stream's blocks; a failure of the stream (not of an insert) is QueryFailed."""
    try:
        yield from stream
    except ClickHouseError as exc:
        raise QueryFailed(str(exc)) from exc


def _invalid_query(exc: BaseException) -> ProblemError:
    text = str(exc)
    found = _SERVER_MESSAGE.search(text)
    message = (found.group(1) if found else text).strip()[:2000]
    return ProblemError(
        422, "invalid_query", message, clickhouse_code=getattr(exc, "code", None) or None
    )


def _bad_member(unit: str, bad: BadMember) -> ProblemError:
    extra: dict[str, Any] = {unit: bad.where}
    return ProblemError(
        422, f"invalid_{unit}", f"{unit} {bad.where}: {bad.msg}; nothing of the segment was kept",
        errors=[{"loc": ["body", bad.where], "code": bad.reason, "msg": bad.msg}], **extra,
    )  # fmt: skip


async def visible(st: AppState, tenant: Tenant, segment_id: str) -> SegmentRow:
    """The tenant's ready segment `segment_id`; 403 beyond the key's segments, else 404."""
    check_segment_allowed(st, tenant, segment_id)
    row = await st.segments.run(st.segments.find, segment_id)
    if row is None or row.deleted or row.tenant_id != tenant.tenant_id:
        raise ProblemError(404, "segment_not_found", "no such segment for this tenant")
    return row


async def delete(st: AppState, tenant: Tenant, segment_id: str) -> None:
    """Unregister the tenant's segment (campaigns to it are refused from now on) and delete
    its members; a fan-out reading it stops at the next page."""
    async with _create_lock(st, segment_id):
        row = await visible(st, tenant, segment_id)
        await st.segments.run(st.segments.write, row.next(deleted=True))
        await st.segments.run(st.segments.purge, segment_id)
    log.info("api.segment_deleted size=%d", row.size)


async def check_segment(st: AppState, tenant_id: str, segment_id: str) -> None:
    """404 `segment_not_found` when `segment_id` is registered to another tenant or deleted
    (or not finished); a segment without a registry row (hand-written) passes."""
    row = await st.segments.run(st.segments.find, segment_id)
    if row is not None and (row.deleted or row.tenant_id != tenant_id):
        st.metrics.rejected.labels("segment_not_found").inc()
        raise ProblemError(404, "segment_not_found", "no such segment for this tenant")
