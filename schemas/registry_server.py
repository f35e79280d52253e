"""The embedded stack's schema registry over HTTP: the Confluent Schema Registry API (the part
clients use) in front of the run directory's registry file.

    python -m schemas.registry_server --host H --port P     (HERALD_REGISTRY_PATH: the file's
                                                              directory, as every Herald process)

`herald up` runs it as the `registry` service, before Herald's own processes; `herald status
--json` gives its `registry_url`. It is the only process that opens the file
(schemas/registry.py `FileRegistry`, its store: ids survive a restart). Herald's processes reach
it as they would a production registry, by HERALD_REGISTRY_URL (schemas/registry.py
`ConfluentRegistry`: confluent-kafka's `SchemaRegistryClient`), and so does any Confluent client
(`AvroSerializer` and `AvroDeserializer`, the Java and Go serializers,
`@kafkajs/confluent-schema-registry`): every producer sees the same ids.

    GET  /subjects                                    ["herald.requests.normal-value", ...]
    GET  /subjects/{subject}/versions                 [1, 2]
    GET  /subjects/{subject}/versions/{n | latest}    {subject, version, id, schema}
    POST /subjects/{subject}/versions  {"schema"}     {id}: registered (the same schema again:
                                                      the same id); 409 when it cannot read data
                                                      written with every earlier version
    POST /subjects/{subject}           {"schema"}     {subject, version, id, schema}: lookup
    GET  /schemas/ids/{id}                            {schema}
    GET  /schemas/ids/{id}/versions                   [{subject, version}]
    POST /compatibility/subjects/{subject}/versions/{n | latest}   {is_compatible, messages}
    GET  /config, GET /config/{subject}               {compatibilityLevel: BACKWARD_TRANSITIVE}
    GET  /healthz                                     ok

Errors carry Confluent's body and codes: {"error_code": 40401, "message": ...} (subject not
found), 40402 (version), 40403 (schema), 409 (incompatible), 42201 (invalid schema), 42202
(invalid version), 50001 (the store failed). Compatibility is BACKWARD_TRANSITIVE for every
subject and cannot be changed here (`PUT /config` answers 422 for any other level). Only Avro.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from herald.config import RegistrySettings
from herald.errors import IncompatibleSchemaError, RegistryError, SchemaError
from schemas.registry import FileRegistry

__all__ = ["create_app", "main"]

log = logging.getLogger(__name__)

MEDIA_TYPE = "application/vnd.schemaregistry.v1+json"
LEVEL = "BACKWARD_TRANSITIVE"


class RegistryProblem(Exception):
    """A Confluent error answer: HTTP status, error_code, message."""

    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _json(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type=MEDIA_TYPE)


def _versions(registry: FileRegistry, subject: str) -> list[int]:
    ids = registry.subjects().get(subject)
    if not ids:
        raise RegistryProblem(404, 40401, f"Subject '{subject}' not found.")
    return ids


def _version(registry: FileRegistry, subject: str, version: str) -> tuple[int, int]:
    """(version number, schema id) of `version` ("latest", -1 or 1..n) of `subject`."""
    ids = _versions(registry, subject)
    if version in ("latest", "-1"):
        return len(ids), ids[-1]
    if not version.isdigit() or int(version) < 1:
        raise RegistryProblem(422, 42202, f"The specified version '{version}' is not valid.")
    if int(version) > len(ids):
        raise RegistryProblem(404, 40402, f"Version {version} not found.")
    return int(version), ids[int(version) - 1]


async def _schema_text(request: Request) -> str:
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        raise RegistryProblem(422, 42201, "Invalid schema: the body is not JSON") from None
    if not isinstance(body, dict) or not isinstance(body.get("schema"), str):
        raise RegistryProblem(422, 42201, "Invalid schema: give it as a string in `schema`")
    if body.get("schemaType", "AVRO") != "AVRO":
        raise RegistryProblem(422, 42201, "Invalid schema: only AVRO schemas are served here")
    text: str = body["schema"]
    from schemas.compat import check_compatible

    try:
        check_compatible(text, [])  # parses it
    except SchemaError as exc:
        raise RegistryProblem(422, 42201, f"Invalid schema: {exc}") from None
    return text


def create_app(registry: FileRegistry) -> Starlette:
    """The HTTP app in front of `registry`."""

    async def subjects(_request: Request) -> Response:
        return _json(sorted(registry.subjects()))

    async def versions(request: Request) -> Response:
        ids = _versions(registry, request.path_params["subject"])
        return _json(list(range(1, len(ids) + 1)))

    async def version(request: Request) -> Response:
        subject = request.path_params["subject"]
        number, schema_id = _version(registry, subject, request.path_params["version"])
        return _json({"subject": subject, "version": number, "id": schema_id,
                      "schema": registry.get_schema(schema_id)})  # fmt: skip

    async def register(request: Request) -> Response:
        subject, text = request.path_params["subject"], await _schema_text(request)
        try:
            schema_id = registry.register_compatible(subject, text)
        except IncompatibleSchemaError as exc:
            raise RegistryProblem(
                409, 409, f"Schema being registered is incompatible with an earlier schema "
                f"for subject '{subject}' ({LEVEL}): {exc}",
            ) from None  # fmt: skip
        log.info("registry.registered subject=%s id=%d", subject, schema_id)
        return _json({"id": schema_id})

    async def lookup(request: Request) -> Response:
        subject, text = request.path_params["subject"], await _schema_text(request)
        ids = _versions(registry, subject)
        wanted = orjson.loads(text)
        for number, schema_id in enumerate(ids, start=1):
            if orjson.loads(registry.get_schema(schema_id)) == wanted:
                return _json({"subject": subject, "version": number, "id": schema_id,
                              "schema": registry.get_schema(schema_id)})  # fmt: skip
        raise RegistryProblem(404, 40403, "Schema not found")

    async def by_id(request: Request) -> Response:
        return _json({"schema": _text_of(request.path_params["id"])})

    async def id_versions(request: Request) -> Response:
        schema_id = int(request.path_params["id"])
        _text_of(str(schema_id))
        subjects = sorted(registry.subjects().items())
        found = [{"subject": name, "version": ids.index(schema_id) + 1}
                 for name, ids in subjects if schema_id in ids]  # fmt: skip
        return _json(found)

    def _text_of(raw_id: str) -> str:
        try:
            return registry.get_schema(int(raw_id))
        except (ValueError, SchemaError):
            raise RegistryProblem(404, 40403, "Schema not found") from None

    async def compatibility(request: Request) -> Response:
        from schemas.compat import check_compatible

        subject, text = request.path_params["subject"], await _schema_text(request)
        ids = _versions(registry, subject)
        _version(registry, subject, request.path_params["version"])  # it exists
        problems = check_compatible(text, [registry.get_schema(i) for i in ids])
        return _json({"is_compatible": not problems, "messages": problems})

    async def config(_request: Request) -> Response:
        return _json({"compatibilityLevel": LEVEL})

    async def set_config(request: Request) -> Response:
        try:
            level = orjson.loads(await request.body()).get("compatibility")
        except (orjson.JSONDecodeError, AttributeError):
            level = None
        if level != LEVEL:
            raise RegistryProblem(422, 42203, f"Only {LEVEL} is served here")
        return _json({"compatibility": LEVEL})

    async def healthz(_request: Request) -> Response:
        return Response(b"ok", media_type="text/plain")

    async def problem(_request: Request, exc: Exception) -> Response:
        if isinstance(exc, RegistryProblem):
            return _json({"error_code": exc.code, "message": exc.message}, exc.status)
        log.error("registry.store_failed error=%s", exc)
        return _json({"error_code": 50001, "message": f"Error in the backend store: {exc}"}, 500)

    routes = [
        Route("/subjects", subjects),
        Route("/subjects/{subject}/versions", versions),
        Route("/subjects/{subject}/versions", register, methods=["POST"]),
        Route("/subjects/{subject}/versions/{version}", version),
        Route("/subjects/{subject}", lookup, methods=["POST"]),
        Route("/schemas/ids/{id}", by_id),
        Route("/schemas/ids/{id}/versions", id_versions),
        Route(
            "/compatibility/subjects/{subject}/versions/{version}", compatibility, methods=["POST"]
        ),  # fmt: skip
        Route("/config", config),
        Route("/config/{subject}", config),
        Route("/config", set_config, methods=["PUT"]),
        Route("/healthz", healthz),
    ]
    handlers = {RegistryProblem: problem, RegistryError: problem}
    return Starlette(routes=routes, exception_handlers=handlers)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    """Serve the registry of HERALD_REGISTRY_PATH until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m schemas.registry_server", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = RegistrySettings()
    if settings.url:
        log.error("registry.not_embedded url=%s (a registry is configured: nothing to serve)",
                  settings.url)  # fmt: skip
        return 2
    app = create_app(FileRegistry(settings.path))
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
