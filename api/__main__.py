"""`python -m api --host H --port P`: load settings from the environment and serve the API."""

from __future__ import annotations

import argparse
import logging

import uvicorn

from api.app import create_app
from api.settings import ApiSettings, ProviderSecrets
from herald.config import HeraldSettings


def main(argv: list[str] | None = None) -> None:
    """Entry point of the API process (one uvicorn worker; scale out with processes)."""
    parser = argparse.ArgumentParser(prog="python -m api", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    settings = HeraldSettings()
    providers = ProviderSecrets()
    if providers.simulator_dir is None:
        providers.simulator_dir = settings.run.run_dir / "simulators"
    app = create_app(settings, api=ApiSettings(), providers=providers)
    uvicorn.run(
        app, host=args.host, port=args.port, log_level=args.log_level, access_log=False,
        loop="auto", http="auto", ws="websockets-sansio", timeout_graceful_shutdown=10,
    )  # fmt: skip


if __name__ == "__main__":
    main()
