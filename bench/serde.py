"""Avro serde: Herald's compiled writer and reader against confluent-kafka's, same run.

    python -m bench.serde [--quick]

Why Herald keeps its own Avro code (schemas/avro_writer.py, schemas/avro_reader.py) beside
confluent-kafka's `AvroSerializer` / `AvroDeserializer` (fastavro underneath): every record of
the pipeline is encoded and decoded by them, several times per delivery. For the three records
of the hot path (delivery_event, delivery, notification_request: tests/schemas/examples.py) this
measures records/s and µs per record of each, in one process, one after the other, on one
schema registry (the `registry` service's HTTP API, as on the stack; both sides cache the
schema, so no HTTP is timed). Framing is included on both sides (magic byte + schema id). The
two are byte for byte the same (tests/schemas/test_registry_server.py).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from bench import _report
from bench._report import figure
from infra.process import free_port
from schemas import schema_text
from schemas.registry import ConfluentRegistry
from schemas.serde import AvroDeserializer as HeraldDeserializer
from schemas.serde import AvroSerializer as HeraldSerializer

SCHEMAS = ("delivery_event", "delivery", "notification_request")


def _example(name: str) -> dict[str, Any]:
    # the records the tests hold byte for byte (tests/ is not a package of the install)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.schemas.examples import example

    return example(name)


def _rate(call: Callable[[], Any], seconds: float) -> float:
    """Calls per second of `call`, the best of three runs of `seconds` each."""
    best = 0.0
    for _ in range(3):
        done, started = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - started) < seconds:
            for _ in range(200):
                call()
            done += 200
        best = max(best, done / elapsed)
    return best


def _registry(run_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "HERALD_REGISTRY_PATH": str(run_dir), "HERALD_REGISTRY_URL": ""}
    proc = subprocess.Popen(
        [sys.executable, "-m", "schemas.registry_server", "--port", str(port)], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the schema registry did not start")


def _rates(
    ours: Any, theirs: Any, read_ours: Any, read_theirs: Any, record: dict[str, Any],
    data: bytes, ctx: SerializationContext, seconds: float,
) -> dict[str, float]:  # fmt: skip
    return {
        "herald encode": _rate(lambda: ours(record), seconds),
        "confluent encode": _rate(lambda: theirs(record, ctx), seconds),
        "herald decode": _rate(lambda: read_ours(data), seconds),
        "confluent decode": _rate(lambda: read_theirs(data, ctx), seconds),
    }


def measure(seconds: float) -> dict[str, dict[str, float]]:
    """schema -> {"herald encode", "confluent encode", "herald decode", "confluent decode"}:
    records/s."""
    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="herald-serde-") as tmp:
        proc, url = _registry(Path(tmp))
        try:
            client = SchemaRegistryClient({"url": url})
            for name in SCHEMAS:
                record = _example(name)
                ctx = SerializationContext(name, MessageField.VALUE)
                ours = HeraldSerializer(ConfluentRegistry(url), f"{name}-value", name)
                theirs = AvroSerializer(client, schema_text(name))
                data = ours(record)
                assert theirs(record, ctx) == data  # the same bytes, or nothing to compare
                read_ours = HeraldDeserializer(ConfluentRegistry(url), name)
                read_theirs = AvroDeserializer(client)
                out[name] = _rates(ours, theirs, read_ours, read_theirs, record, data, ctx,
                                   seconds)  # fmt: skip
        finally:
            proc.terminate()
            proc.wait(10)
    return out


def result_of(rates: dict[str, dict[str, float]]) -> dict[str, Any]:
    """The report's figures: Herald's rate with confluent-kafka's as the baseline."""
    figures = []
    their = {
        "encode": "confluent-kafka AvroSerializer",
        "decode": "confluent-kafka AvroDeserializer",
    }
    for name, r in rates.items():
        for op in ("encode", "decode"):
            figures.append(figure(
                f"{name}: {op}, records/s", r[f"herald {op}"], "rec/s",
                baseline=r[f"confluent {op}"], baseline_name=their[op],
            ))  # fmt: skip
    return _report.result(
        "Avro serde: Herald's compiled writer and reader beside confluent-kafka's",
        figures,
        notes=["Framed records (magic byte + schema id) of tests/schemas/examples.py, one "
               "process, best of 3 runs each; byte for byte the same bytes on both sides."],
        details={"rates": rates},
    )  # fmt: skip


def result(quick: bool = False) -> dict[str, Any]:
    """The scenario for `python -m bench` (bench/__main__.py)."""
    return result_of(measure(0.2 if quick else 2.0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    for name, r in measure(0.2 if args.quick else 2.0).items():
        print(f"== {name}")
        for op in ("encode", "decode"):
            ours, theirs = r[f"herald {op}"], r[f"confluent {op}"]
            print(f"  {op}: herald {ours:,.0f}/s ({1e6 / ours:.1f} µs), confluent-kafka "
                  f"{theirs:,.0f}/s ({1e6 / theirs:.1f} µs): {ours / theirs:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
