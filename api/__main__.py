"""`python -m api --host H --port P [--workers N]`: load settings from the environment and serve.

With `--workers N > 1` uvicorn runs N processes on one port (each with its own Kafka producer
and Redis pool; all state is shared through Redis and Kafka). Settings are read in
`create_app_from_env`, i.e. in each worker, never at import time.
"""

from __future__ import annotations

import argparse
import logging

import uvicorn


def main(argv: list[str] | None = None) -> None:
    """Entry point of the API process."""
    parser = argparse.ArgumentParser(prog="python -m api", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    uvicorn.run(
        "api.app:create_app_from_env", factory=True, host=args.host, port=args.port,
        workers=args.workers, log_level=args.log_level, access_log=False, loop="auto",
        http="auto", ws="websockets-sansio", ws_per_message_deflate=False,
        timeout_graceful_shutdown=10,
    )  # fmt: skip


if __name__ == "__main__":
    main()
