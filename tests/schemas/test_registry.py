"""Schema registries: id semantics, persistence, and concurrent registration across processes."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

import schemas
from herald.config import RegistrySettings
from herald.errors import RegistryError
from schemas.registry import (
    ConfluentRegistry,
    FileRegistry,
    SchemaNotFoundError,
    SchemaRegistry,
    make_registry,
)

ROOT = Path(__file__).resolve().parents[2]


def test_ids_are_sequential_idempotent_and_shared_across_subjects(tmp_path: Path) -> None:
    reg = FileRegistry(tmp_path)
    a = reg.register("t1-value", schemas.schema_text("delivery"))
    b = reg.register("t2-value", schemas.schema_text("social_event"))
    assert (a, b) == (1, 2)
    assert reg.register("t1-value", schemas.schema_text("delivery")) == 1
    # identical schema under another subject -> same id (Confluent semantics)
    assert reg.register("t3-value", schemas.schema_text("delivery")) == 1
    # formatting differences do not make a new schema
    pretty = json.dumps(json.loads(schemas.schema_text("delivery")), indent=4)
    assert reg.register("t4-value", pretty) == 1
    assert reg.subject_versions("t3-value") == [1]
    assert reg.get_schema(2) == schemas.schema_text("social_event")


def test_state_survives_a_new_instance(tmp_path: Path) -> None:
    FileRegistry(tmp_path).register("s", schemas.schema_text("delivery"))
    fresh = FileRegistry(tmp_path)
    assert fresh.get_schema(1) == schemas.schema_text("delivery")
    assert fresh.register("s", schemas.schema_text("delivery")) == 1


def test_unknown_id_rereads_the_file_before_failing(tmp_path: Path) -> None:
    reader = FileRegistry(tmp_path)
    with pytest.raises(SchemaNotFoundError):
        reader.get_schema(1)
    FileRegistry(tmp_path).register("s", schemas.schema_text("dead_letter"))  # another process
    assert reader.get_schema(1) == schemas.schema_text("dead_letter")
    with pytest.raises(SchemaNotFoundError):
        reader.get_schema(99)


def test_invalid_schema_text_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RegistryError):
        FileRegistry(tmp_path).register("s", "{not json")


def test_corrupt_state_file_is_a_registry_error(tmp_path: Path) -> None:
    (tmp_path / FileRegistry.STATE_FILE).write_text("{oops")
    with pytest.raises(RegistryError):
        FileRegistry(tmp_path).register("s", schemas.schema_text("delivery"))


_CHILD = """
import json, sys, time
from pathlib import Path
from schemas import schema_names, schema_text
from schemas.registry import FileRegistry
path, go, order = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
names = schema_names() if order == "fwd" else list(reversed(schema_names()))
reg = FileRegistry(path)
(go.parent / f"ready-{sys.argv[4]}").touch()
while not go.exists():
    time.sleep(0.001)
ids = {f"{n}|{s}": reg.register(f"{s}-{n}", schema_text(n)) for n in names for s in ("a", "b")}
print(json.dumps(ids))
"""


def test_concurrent_processes_get_identical_ids(tmp_path: Path) -> None:
    """Processes racing to register the same schemas (in opposite orders) agree on every id."""
    go = tmp_path / "go"
    reg_dir = tmp_path / "registry"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(reg_dir), str(go), ("fwd", "rev")[i % 2], str(i)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(6)
    ]
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("ready-*"))) < len(procs):  # every child at the barrier
        assert time.monotonic() < deadline, "children did not start"
        time.sleep(0.01)
    go.touch()
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        results.append(json.loads(out))
    assert all(r == results[0] for r in results)
    n = len(schemas.schema_names())
    assert sorted(set(results[0].values())) == list(range(1, n + 1))
    state = json.loads((reg_dir / FileRegistry.STATE_FILE).read_text())
    assert len(state["schemas"]) == n
    assert len(state["subjects"]) == 2 * n


def test_make_registry_selects_by_settings(tmp_path: Path) -> None:
    file_reg = make_registry(RegistrySettings(path=tmp_path))
    assert isinstance(file_reg, FileRegistry)
    assert isinstance(file_reg, SchemaRegistry)
    remote = make_registry(
        RegistrySettings(url="http://127.0.0.1:1", basic_auth_user_info="u:p", path=tmp_path)
    )
    assert isinstance(remote, ConfluentRegistry)


class _FakeConfluent(BaseHTTPRequestHandler):
    """The two endpoints of the Confluent Schema Registry REST API the client uses."""

    schemas: ClassVar[list[str]] = []
    requests: ClassVar[int] = 0

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802 - http.server naming
        type(self).requests += 1
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body["schema"] not in self.schemas:
            self.schemas.append(body["schema"])
        self._reply(200, {"id": self.schemas.index(body["schema"]) + 1})

    def do_GET(self) -> None:  # noqa: N802
        type(self).requests += 1
        schema_id = int(self.path.split("?")[0].rstrip("/").split("/")[-1])
        if 1 <= schema_id <= len(self.schemas):
            self._reply(200, {"schema": self.schemas[schema_id - 1]})
        else:
            self._reply(404, {"error_code": 40403, "message": "Schema not found"})

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def fake_confluent() -> Iterator[str]:
    _FakeConfluent.schemas = []
    _FakeConfluent.requests = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeConfluent)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_confluent_registry_registers_resolves_and_caches(fake_confluent: str) -> None:
    reg = ConfluentRegistry(fake_confluent, client_conf={"max.retries": 0})
    text = schemas.schema_text("delivery")
    assert reg.register("a-value", text) == 1
    assert reg.register("a-value", text) == 1
    assert reg.register("b-value", schemas.schema_text("social_event")) == 2
    fresh = ConfluentRegistry(fake_confluent, client_conf={"max.retries": 0})
    assert json.loads(fresh.get_schema(2)) == json.loads(schemas.schema_text("social_event"))
    before = _FakeConfluent.requests
    fresh.get_schema(2)
    reg.register("a-value", text)
    assert _FakeConfluent.requests == before  # both served from memory
    with pytest.raises(SchemaNotFoundError):
        fresh.get_schema(42)


def test_unreachable_confluent_registry_is_not_an_unknown_id() -> None:
    """An unreachable registry is an infrastructure RegistryError, not bad data."""
    reg = ConfluentRegistry("http://127.0.0.1:1", client_conf={"max.retries": 0})
    with pytest.raises(RegistryError) as info:
        reg.register("s", schemas.schema_text("delivery"))
    assert not isinstance(info.value, SchemaNotFoundError)
    with pytest.raises(RegistryError) as info:
        reg.get_schema(1)
    assert not isinstance(info.value, SchemaNotFoundError)
