"""`python -m infra.simulators <name> --port N ...`: run one provider simulator."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Any

import orjson
import uvloop

from infra.simulators import SIMULATORS, simulator_class
from infra.simulators import __doc__ as simulators_doc
from infra.simulators.keys import write_private
from infra.simulators.server import serve


def _load_config(value: str | None) -> dict[str, Any]:
    """`--config` is inline JSON or a path to a JSON file."""
    if not value:
        return {}
    text = value if value.lstrip().startswith("{") else Path(value).read_text()
    data = orjson.loads(text)
    if not isinstance(data, dict):
        raise SystemExit("--config must be a JSON object")
    return data


IDENTITY_FILE = "identity.json"


def _identity(state_dir: Path, port: int) -> dict[str, Any]:
    """Generated credentials of an earlier run of this simulator on the same port, or {}.

    A provider keeps its keys and secrets when it restarts: the supervisor restarts a killed
    simulator on the same port, and clients started before (dispatch jobs) still hold the
    credentials it generated the first time. A new stack (new ports) generates new ones.
    """
    try:
        saved = orjson.loads((state_dir / IDENTITY_FILE).read_bytes())
        orjson.loads((state_dir / "credentials.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    if not isinstance(saved, dict) or saved.get("port") != port:
        return {}
    generated = saved.get("generated")
    return dict(generated) if isinstance(generated, dict) else {}


def _save_identity(
    state_dir: Path, port: int, previous: dict[str, Any], given: dict[str, Any], sim: Any
) -> None:
    """Keep the config fields the simulator generated (secrets, keys) for a restart."""
    asked = type(sim.config).model_validate(given).model_dump(mode="json")
    effective = sim.config.model_dump(mode="json")
    generated = {k: v for k, v in effective.items() if k not in given and asked.get(k) != v}
    doc = {"port": port, "generated": {**previous, **generated}}
    write_private(state_dir / IDENTITY_FILE, orjson.dumps(doc))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m infra.simulators",
        description=simulators_doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("name", choices=sorted(SIMULATORS))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--config", help="fault/credential config: inline JSON or a JSON file")
    parser.add_argument(
        "--callback-url", help="where receipts go (Herald /v1/callbacks/{provider})"
    )
    parser.add_argument("--state-dir", type=Path, help="TLS files, keys, credentials.json")
    parser.add_argument("--log-level", default=os.environ.get("HERALD_LOG_LEVEL", "INFO"))
    args = parser.parse_args(argv)

    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    state_dir: Path = args.state_dir or Path(".herald/run/simulators") / args.name
    state_dir.mkdir(parents=True, exist_ok=True)
    cls = simulator_class(args.name)
    cli_config = _load_config(args.config)
    previous = _identity(state_dir, args.port)
    config = cls.config_model.model_validate({**previous, **cli_config})
    sim = cls(
        config,
        state_dir=state_dir,
        host=args.host,
        port=args.port,
        callback_url=args.callback_url,
    )
    _save_identity(state_dir, args.port, previous, cli_config, sim)
    credentials = sim.credentials()
    if previous:  # what this restart did not regenerate (key paths) stays as it was
        old = orjson.loads((state_dir / "credentials.json").read_bytes())
        credentials = {**old, **{k: v for k, v in credentials.items() if v is not None}}
    write_private(
        state_dir / "credentials.json", orjson.dumps(credentials, option=orjson.OPT_INDENT_2)
    )
    streams = getattr(sim.config, "max_concurrent_streams", 1000)
    # uvloop: Granian hands every request to the event loop from its own threads
    # (call_soon_threadsafe); asyncio's self-pipe wake-ups cost ~45% more CPU per request.
    uvloop.run(serve(sim, max_concurrent_streams=streams))


if __name__ == "__main__":
    main()
