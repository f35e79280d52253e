"""Planning inputs: admitted requests, audience tasks and the user table. Pure, no I/O, no clock.

The plan job (dataflows/plan.py) moves these objects between its steps:

    NotificationRequest record --admit_request--> PlanRequest     (validated once per request)
    PlanRequest + up to 1,000 users -----------> AudienceBatch    (one fan-out unit)
    AudienceBatch --split_by_shard-------------> UserTasks        (the users of one shard)
    UserTasks + UserTable ----------------------> Planned          (each user with their state)

`UserTable` holds the latest `Preferences` and `ContactPoints` per user, fed by the compacted
herald.preferences / herald.devices changelogs: a record replaces the held one unless its
`version` is lower; a tombstone (null value) deletes it, and the deleted version is kept as a
floor: the user joins as defaults at that version, so an older copy of the state held
elsewhere (the API's Redis copy, dataflows/_copies.py) is not taken for a newer one. Users are
spread over `shards` keys by `shard_of` (crc32, identical in every process), so one Bytewax key
holds the table of many users.

Bad requests raise `InvalidRequest` or a `CatalogLookupError` (both carry a machine-readable
`code`); the job dead-letters them before any fan-out.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from herald.catalog import Catalog, MissingParam, normalize_locale
from herald.errors import HeraldError
from herald.policy import ContactPoints, PolicyRequest, Preferences

__all__ = [
    "AudienceBatch",
    "CaughtUp",
    "InvalidRequest",
    "PlanRequest",
    "Planned",
    "TableUpdate",
    "UserTable",
    "UserTasks",
    "UserView",
    "admit_request",
    "chunk_users",
    "shard_of",
    "split_by_shard",
]

UserParams = Mapping[str, str] | None


class InvalidRequest(HeraldError):
    """A request the plan job cannot plan; `code` is machine-readable (dead-letter reason)."""

    def __init__(self, code: str, detail: str = "") -> None:
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code
        self.detail = detail


def shard_of(user_id: str, shards: int) -> str:
    """The user-table key of a user: crc32 modulo `shards`, as a string (Bytewax keys are str)."""
    return str(zlib.crc32(user_id.encode()) % shards)


@dataclass(frozen=True, slots=True)
class PlanRequest:
    """What planning needs of one notification; shared by every user task of the request.

    `origin` is `topic:partition:offset` of the record it was read from (request dedup tells a
    replay of the same record from a second copy of the request by it).
    """

    notification_id: str
    request_id: str
    tenant_id: str
    notification_type: str
    category: str
    traffic_class: str
    params: Mapping[str, str]
    policy: PolicyRequest
    segment_id: str | None
    origin: str
    send_local_time: str | None = None

    @property
    def template_version(self) -> int | None:
        """The pinned template version (None = the catalog's current one)."""
        return self.policy.template_version


def admit_request(rec: Mapping[str, Any], catalog: Catalog, origin: str) -> PlanRequest:
    """Validate a decoded `NotificationRequest` against the catalog; raises with a `code`.

    Checks: known type (`unknown_notification_type`), existing pinned template version
    (`unknown_template_version`), every required template param present (`missing_param:<name>`),
    a well-formed locale (`invalid_locale`), exactly one of user_ids / segment_id
    (`no_recipients`, `ambiguous_recipients`). The traffic class and category are the catalog's.
    """
    nt = catalog.get(rec["notification_type"])
    templates = nt.template_set(rec.get("template_version"))
    params: Mapping[str, str] = rec.get("params") or {}
    missing = sorted(templates.params.difference(params))
    if missing:
        raise MissingParam(missing[0])
    if rec.get("locale"):
        normalize_locale(rec["locale"])
    recipients = rec["recipients"]
    segment_id, user_ids = recipients.get("segment_id"), recipients.get("user_ids") or []
    if segment_id and user_ids:
        raise InvalidRequest("ambiguous_recipients", "both user_ids and segment_id are set")
    if not segment_id and not user_ids:
        raise InvalidRequest("no_recipients", "neither user_ids nor segment_id is set")
    return PlanRequest(
        notification_id=rec["notification_id"],
        request_id=rec["request_id"],
        tenant_id=rec["tenant_id"],
        notification_type=nt.name,
        category=nt.category,
        traffic_class=nt.traffic_class,
        params=dict(params),
        policy=PolicyRequest.from_record(rec),
        segment_id=segment_id or None,
        origin=origin,
        send_local_time=rec.get("send_local_time"),
    )


@dataclass(frozen=True, slots=True)
class AudienceBatch:
    """Up to `audience_batch_size` users of one request; `batch_no` counts from 0.

    `users` pairs each user id with its per-user template params (segment rows may carry some,
    e.g. first_name; None = none). `last` is True for the final batch of the request.
    """

    request: PlanRequest
    batch_no: int
    users: tuple[tuple[str, UserParams], ...]
    last: bool


def chunk_users(request: PlanRequest, user_ids: list[str], size: int) -> Iterator[AudienceBatch]:
    """Inline recipients as audience batches of at most `size` users (duplicates dropped)."""
    unique = list(dict.fromkeys(user_ids))
    count = max(1, -(-len(unique) // size))
    for n in range(count):
        part = unique[n * size : (n + 1) * size]
        yield AudienceBatch(request, n, tuple((u, None) for u in part), n == count - 1)


@dataclass(frozen=True, slots=True)
class UserTasks:
    """The users of one audience batch that live in one user-table shard."""

    request: PlanRequest
    batch_no: int
    users: tuple[tuple[str, UserParams], ...]


def split_by_shard(batch: AudienceBatch, shards: int) -> list[tuple[str, UserTasks]]:
    """`(shard key, UserTasks)` for each shard the batch's users fall in."""
    groups: dict[str, list[tuple[str, UserParams]]] = {}
    for user in batch.users:
        groups.setdefault(shard_of(user[0], shards), []).append(user)
    return [
        (key, UserTasks(batch.request, batch.batch_no, tuple(us))) for key, us in groups.items()
    ]


@dataclass(frozen=True, slots=True)
class UserView:
    """One recipient with the state planning uses (defaults when the table has nothing)."""

    user_id: str
    params: UserParams
    prefs: Preferences
    contacts: ContactPoints


@dataclass(frozen=True, slots=True)
class Planned:
    """UserTasks joined with the user table: ready for the policy."""

    request: PlanRequest
    batch_no: int
    users: tuple[UserView, ...]


@dataclass(frozen=True, slots=True)
class TableUpdate:
    """One changelog record: new preferences or contact points of a user; None = tombstone."""

    kind: Literal["preferences", "contacts"]
    user_id: str
    value: Preferences | ContactPoints | None


@dataclass(frozen=True, slots=True)
class CaughtUp:
    """A changelog partition reached the end it had when the job started (`part` names it)."""

    part: str


@dataclass
class UserTable:
    """Latest preferences and contact points of the users of one shard (see module doc)."""

    prefs: dict[str, Preferences] = field(default_factory=dict)
    contacts: dict[str, ContactPoints] = field(default_factory=dict)
    # (kind, user_id) -> version of the record a tombstone deleted
    deleted: dict[tuple[str, str], int] = field(default_factory=dict)

    def apply(self, update: TableUpdate) -> bool:
        """Apply a changelog record; False when it is older than what is held (ignored)."""
        table: dict[str, Any] = self.prefs if update.kind == "preferences" else self.contacts
        if update.value is None:
            gone = table.pop(update.user_id, None)
            if gone is not None:
                self.deleted[(update.kind, update.user_id)] = gone.version
            return True
        held = table.get(update.user_id)
        if held is not None and update.value.version < held.version:
            return False
        table[update.user_id] = update.value
        if self.deleted:
            self.deleted.pop((update.kind, update.user_id), None)
        return True

    def join(self, tasks: UserTasks) -> Planned:
        """Each task's user with their latest state (defaults: no opt-outs, no contacts)."""
        prefs, contacts = self.prefs, self.contacts
        views = tuple(
            UserView(
                user_id,
                params,
                prefs.get(user_id) or self._default_prefs(user_id),
                contacts.get(user_id) or self._default_contacts(user_id),
            )
            for user_id, params in tasks.users
        )
        return Planned(tasks.request, tasks.batch_no, views)

    def _default_prefs(self, user_id: str) -> Preferences:
        return Preferences(user_id, version=self.deleted.get(("preferences", user_id), 0))

    def _default_contacts(self, user_id: str) -> ContactPoints:
        return ContactPoints(user_id, version=self.deleted.get(("contacts", user_id), 0))
