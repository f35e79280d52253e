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
    │   └── AlreadyRunningError   a stack is already running in this run directory
    ├── DeliveryError          a Kafka producer could not deliver a record
    └── MigrationError         a ClickHouse migration failed
"""

from __future__ import annotations


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
