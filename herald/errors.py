"""Herald's exception tree.

Exceptions are for bugs and infrastructure; bad records flow as dead-letter data instead.

    HeraldError
    ├── ConfigError            invalid configuration file or settings
    ├── SchemaError            Avro schema problems
    │   ├── SerdeError         a record could not be encoded/decoded (carries a reason code)
    │   ├── RegistryError      the schema registry refused or could not resolve a subject/id
│   │   └── SchemaNotFoundError   the registry answered: no schema with that id (bad data)
    │   └── IncompatibleSchemaError   a schema change would break existing readers
    ├── InfraError             embedded services: start, health, shutdown
    │   ├── AlreadyRunningError   a stack is already running in this run directory
    │   ├── StackNotRunningError  no ready stack in the run directory (the stack client)
    │   └── ApiError              the API answered another status than expected (stack client)
    ├── DeliveryError          a Kafka producer could not deliver a record
    ├── MigrationError         a ClickHouse migration failed
    ├── SealUnavailable        a dead letter's sealing key could not be read or made (Redis)
    ├── InvalidRequest         a notification request that cannot be accepted or planned (code)
    ├── CatalogLookupError     a lookup against the catalog failed (code: API 422, dead letters)
    │   ├── UnknownNotificationType
    │   └── TemplateError      a template could not be selected or rendered
    │       ├── UnknownTemplateVersion, NoTemplate, InvalidLocale, MissingParam
    │       └── RenderFailed
    ├── InvalidTimezone        not a usable IANA time zone (code invalid_timezone)
    └── InvalidTimeOfDay       not HH:MM (code invalid_time_of_day)

Every exception class Herald defines on purpose is here (STYLE 16); the modules that raise them
import them from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx


class HeraldError(Exception):
    """Root of every exception Herald raises on purpose."""


class ConfigError(HeraldError):
    """A configuration file or setting is invalid."""


class SchemaError(HeraldError):
    """An Avro schema is invalid or cannot be used."""


class SerdeError(SchemaError):
    """A record could not be encoded or decoded.

    `reason` is a short machine-readable code (e.g. `bad_magic_byte`, `unknown_schema_id`,
    `schema_violation`) that ends up in dead-letter records.
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class RegistryError(SchemaError):
    """The schema registry refused a registration or could not resolve a subject or id."""


class SchemaNotFoundError(RegistryError):
    """The registry answered, and it has no schema with the requested id.

    Distinct from other `RegistryError`s (registry unreachable, refused): a record naming an
    unknown id is bad data (dead-lettered), an unreachable registry is an infrastructure fault.
    """


class IncompatibleSchemaError(SchemaError):
    """A new schema version cannot read data written with an earlier version."""


class InfraError(HeraldError):
    """An embedded service failed to start, stay healthy or stop."""


class AlreadyRunningError(InfraError):
    """`herald up` was called while a stack is already running in the same run directory."""


class DeliveryError(HeraldError):
    """A Kafka producer reported that a record was not delivered."""


class MigrationError(HeraldError):
    """A ClickHouse migration could not be applied."""


class StackNotRunningError(InfraError):
    """No ready stack in the run directory (start one with `make run` or `herald up -d`)."""


class ApiError(InfraError):
    """The API answered something else than the expected status; the message has its body."""

    def __init__(self, what: str, response: httpx.Response) -> None:
        super().__init__(f"{what}: HTTP {response.status_code}: {response.text[:2000]}")
        self.status_code = response.status_code
        self.body = response.text


class SealUnavailable(HeraldError):
    """The hour's key could not be read or made (Redis unreachable)."""


class InvalidRequest(HeraldError):
    """A notification request that cannot be accepted (the producer SDK: `code` as the API's 4xx
    codes, `loc` the field path) or planned (the plan job: `code` is the dead-letter reason)."""

    def __init__(self, code: str, detail: str = "", loc: list[Any] | None = None) -> None:
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code
        self.detail = detail
        self.loc = loc or []


class CatalogLookupError(HeraldError):
    """A lookup against the catalog failed; `code` is machine-readable (API 422, dead letters)."""

    def __init__(self, code: str, detail: str = "") -> None:
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code
        self.detail = detail


class UnknownNotificationType(CatalogLookupError):
    """The notification type is not in the catalog."""

    def __init__(self, name: object) -> None:
        super().__init__("unknown_notification_type", repr(name))


class TemplateError(CatalogLookupError):
    """A template could not be selected or rendered."""


class UnknownTemplateVersion(TemplateError):
    """The pinned template version does not exist for the type."""

    def __init__(self, type_name: str, version: object) -> None:
        super().__init__("unknown_template_version", f"{type_name} has no version {version!r}")


class NoTemplate(TemplateError):
    """The type has no template for the channel."""

    def __init__(self, type_name: str, channel: str) -> None:
        super().__init__(f"no_template:{channel}", f"{type_name} has no {channel!r} template")


class InvalidLocale(TemplateError):
    """A locale is not a well-formed BCP 47 tag."""

    def __init__(self, value: object) -> None:
        super().__init__("invalid_locale", repr(value))


class MissingParam(TemplateError):
    """A parameter the template needs was not given."""

    def __init__(self, name: str) -> None:
        super().__init__(f"missing_param:{name}")
        self.param = name


class RenderFailed(TemplateError):
    """The template engine refused to render (sandbox violation, bad filter argument...)."""

    def __init__(self, detail: str) -> None:
        super().__init__("render_failed", detail)


class InvalidTimezone(HeraldError):
    """A time zone name is not a usable IANA key. `code` is `invalid_timezone`."""

    code = "invalid_timezone"

    def __init__(self, name: object) -> None:
        super().__init__(f"invalid_timezone: {name!r} is not an IANA time zone")
        self.name = name


class InvalidTimeOfDay(HeraldError):
    """A local time is not `HH:MM` (24 h). `code` is `invalid_time_of_day`."""

    code = "invalid_time_of_day"

    def __init__(self, value: object) -> None:
        super().__init__(f"invalid_time_of_day: {value!r} is not HH:MM (00:00-23:59)")
        self.value = value
