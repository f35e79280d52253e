"""What Herald's own HTTP/2 transport (h2transport.py) needs around a connection: the client TLS
context with its ALPN protocol, and the mapping of connection failures to httpx's exceptions
(ConnectTimeout / ConnectError: nothing was sent, so the provider clients may fail over)."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Callable, Iterator

import httpx

__all__ = ["client_tls", "connect_errors"]


def client_tls(verify: ssl.SSLContext | bool, alpn: str) -> ssl.SSLContext:
    """`verify` (a context, True for the default trust store, False for none) offering `alpn`."""
    if isinstance(verify, ssl.SSLContext):
        context = verify
    else:
        context = ssl.create_default_context()
        if not verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols([alpn])
    return context


@contextlib.contextmanager
def connect_errors(host: str, port: int, cleanup: Callable[[], None]) -> Iterator[None]:
    """Around opening a connection: a timeout or socket/TLS error runs `cleanup` and is raised as
    httpx.ConnectTimeout / httpx.ConnectError."""
    try:
        yield
    except TimeoutError as exc:
        cleanup()
        raise httpx.ConnectTimeout(f"connect to {host}:{port} timed out") from exc
    except (OSError, ssl.SSLError) as exc:
        cleanup()
        raise httpx.ConnectError(f"connect to {host}:{port}: {exc}") from exc
