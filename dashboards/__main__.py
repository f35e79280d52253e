"""`python -m dashboards --host H --port P`: serve the Herald dashboard until SIGTERM/SIGINT.

Settings come from the HERALD_* environment (ClickHouse DSN, Redis URL, Kafka, run directory
whose `recovery/` holds the jobs' positions), as for every Herald process. Ready when
`GET /healthz` answers 200 (ClickHouse reachable).
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from pathlib import Path

from dashboards.server import DEFAULT_PROVIDERS, Dashboards, make_server
from herald.config import HeraldSettings


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m dashboards", description="Serve the Herald dashboard."
    )
    parser.add_argument("--host", default="127.0.0.1", help="listen address")
    parser.add_argument("--port", type=int, default=8050, help="listen port (0: any free port)")
    parser.add_argument("--providers", default=",".join(DEFAULT_PROVIDERS),
                        help="providers whose circuit breakers are shown")  # fmt: skip
    parser.add_argument("--recovery-dir", type=Path, default=None,
                        help="jobs' recovery stores (default: <run dir>/recovery)")  # fmt: skip
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    app = Dashboards(HeraldSettings(), args.providers.split(","), args.recovery_dir)
    try:
        server, _thread = make_server(app, args.host, args.port)
    except OSError as exc:
        logging.getLogger(__name__).error("dashboards.bind_failed error=%s", exc)
        return 2
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass
    server.shutdown()
    server.server_close()
    app.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
