"""Planning inputs: admitted requests and audience batches. Pure, no I/O, no clock.

The plan job (dataflows/plan/flow.py) moves these objects between its steps:

    NotificationRequest record --admit_request--> PlanRequest     (validated once per request)
    PlanRequest + up to 1,000 users -----------> AudienceBatch    (one fan-out unit)
    AudienceBatch + the users' copies ----------> Planned          (each user with their state,
                                                                    dataflows/_user_copies.py)

Bad requests raise `InvalidRequest` or a `CatalogLookupError` (both carry a machine-readable
`code`); the job dead-letters them before any fan-out.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from herald.catalog import Catalog
from herald.catalog_fields import normalize_locale
from herald.errors import InvalidRequest, MissingParam
from herald.ids import notification_id
from herald.policy import ContactPoints, PolicyRequest, Preferences
from herald.tracing import traceparent

if TYPE_CHECKING:
    from herald.tenants import TenantTypes

__all__ = [
    "AudienceBatch",
    "PlanRequest",
    "Planned",
    "UserView",
    "admit_request",
    "chunk_users",
]

UserParams = Mapping[str, str] | None


API_SOURCE = "api"  # `source` of the requests the API accepted (it made their ids)
DIGEST_SOURCE = "digest"  # `source` of the requests the digest job made (herald/digest.py)


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
    source: str = "api"  # who produced the record: api | producer | outbox | digest
    traceparent: str | None = None  # W3C trace context, carried onto every record (tracing)

    @property
    def template_version(self) -> int | None:
        """The pinned template version (None = the catalog's current one)."""
        return self.policy.template_version


def admit_request(
    rec: Mapping[str, Any],
    catalog: Catalog,
    origin: str,
    tenants: TenantTypes | None = None,
) -> PlanRequest:
    """Validate a decoded `NotificationRequest` against the catalog; raises with a `code`.

    Checks: a request another producer than the API wrote carries the id the API would give
    it (`notification_id_mismatch`: ids are how duplicates collide and how a tenant finds its
    notification), known type (`unknown_notification_type`), a tenant that may send it when
    neither the API nor the digest job made the request (`unknown_tenant`, `type_not_allowed`:
    herald/tenants.py; skipped without `tenants`), existing pinned template version
    (`unknown_template_version`), every required template param present (`missing_param:<name>`),
    a well-formed locale (`invalid_locale`), exactly one of user_ids / segment_id
    (`no_recipients`, `ambiguous_recipients`). The traffic class and category are the catalog's.
    """
    if rec.get("source") != API_SOURCE and rec["notification_id"] != notification_id(
        rec["tenant_id"], rec["request_id"]
    ):
        raise InvalidRequest(
            "notification_id_mismatch",
            "a producer's notification_id must be ids.notification_id(tenant_id, request_id)",
        )
    nt = catalog.get(rec["notification_type"])
    if tenants is not None and rec.get("source") not in (API_SOURCE, DIGEST_SOURCE):
        refused = tenants.refusal(rec["tenant_id"], nt.name)
        if refused is not None:
            raise refused
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
        source=str(rec.get("source") or ""),
        traceparent=traceparent(rec.get("traceparent")),
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
class UserView:
    """One recipient with the state planning uses (defaults when the user has no copy)."""

    user_id: str
    params: UserParams
    prefs: Preferences  # the plan job shares one among users with the same choices (its
    # user_id is "" then: dataflows/_user_copies.py); planning reads the choices only
    contacts: ContactPoints


@dataclass(frozen=True, slots=True)
class Planned:
    """An audience batch's users with their state: ready for the policy."""

    request: PlanRequest
    batch_no: int
    users: tuple[UserView, ...]
