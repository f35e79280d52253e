"""`python -m infra.simulators <name> --port N ...`: run one provider simulator."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from pathlib import Path
from typing import Any

import orjson

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
    config = cls.config_model.model_validate(_load_config(args.config))
    sim = cls(
        config,
        state_dir=state_dir,
        host=args.host,
        port=args.port,
        callback_url=args.callback_url,
    )
    write_private(
        state_dir / "credentials.json", orjson.dumps(sim.credentials(), option=orjson.OPT_INDENT_2)
    )
    streams = getattr(sim.config, "max_concurrent_streams", 1000)
    asyncio.run(serve(sim, max_concurrent_streams=streams))


if __name__ == "__main__":
    main()
