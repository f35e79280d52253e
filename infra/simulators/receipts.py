"""Status callbacks a simulator posts to Herald: timing, duplication, reordering, signing.

`plan()` turns one message's status sequence into (delay, status) pairs following the
`ReceiptConfig` (base delay + step gap; reversed with probability `out_of_order`; each status
repeated with probability `duplicate`). `CallbackPoster` posts them at those delays. The signers
below produce the providers' documented signatures (the verifying side is each provider
folder's `signature.py`, sinks/providers/<vendor>/, written independently).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import logging
from collections.abc import Mapping
from typing import TypeVar

import httpx
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from infra.simulators.config import ReceiptConfig
from infra.simulators.faults import Faults, Stats

__all__ = ["CallbackPoster", "plan", "sign_sendgrid", "sign_twilio", "sign_vonage"]

log = logging.getLogger(__name__)

T = TypeVar("T")


def plan(steps: list[T], cfg: ReceiptConfig, faults: Faults, stats: Stats) -> list[tuple[float, T]]:
    """(delay seconds, step) for one message's status sequence, duplicated/reordered per `cfg`."""
    base = faults.sample(cfg.delay)
    gap = cfg.step_ms / 1000.0
    times = [base + i * gap for i in range(len(steps))]
    ordered = list(steps)
    if len(steps) > 1 and faults.chance(cfg.out_of_order):
        ordered.reverse()
        stats.callbacks["reordered"] += 1
    timed = list(zip(times, ordered, strict=True))
    out = list(timed)
    for when, step in timed:
        if faults.chance(cfg.duplicate):
            out.append((when + gap / 2, step))
            stats.callbacks["duplicated"] += 1
    out.sort(key=lambda pair: pair[0])
    return out


def sign_twilio(auth_token: str, url: str, params: Mapping[str, str]) -> str:
    """X-Twilio-Signature: base64 HMAC-SHA1 over the URL + sorted params as key+value."""
    data = url + "".join(k + params[k] for k in sorted(params))
    digest = hmac.new(auth_token.encode(), data.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


_VONAGE_HASHES = {
    "md5": hashlib.md5,
    "sha1": hashlib.sha1,
    "sha256": hashlib.sha256,
    "sha512": hashlib.sha512,
}


def sign_vonage(secret: str, params: Mapping[str, str], method: str = "sha256") -> str:
    """Vonage `sig`: sorted `&key=value` ('&'/'=' in values → '_'), HMAC (or md5hash) hex."""
    text = "".join(
        f"&{k}={str(params[k]).replace('&', '_').replace('=', '_')}"
        for k in sorted(params)
        if k != "sig"
    )
    if method == "md5hash":
        return hashlib.md5((text + secret).encode()).hexdigest()
    return hmac.new(secret.encode(), text.encode(), _VONAGE_HASHES[method]).hexdigest()


def sign_sendgrid(private_pem: bytes, timestamp: str, body: bytes) -> str:
    """X-Twilio-Email-Event-Webhook-Signature: base64 DER ECDSA-P256/SHA-256(timestamp+body)."""
    key = serialization.load_pem_private_key(private_pem, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    signature = key.sign(timestamp.encode() + body, ec.ECDSA(hashes.SHA256()))
    return base64.b64encode(signature).decode()


class CallbackPoster:
    """Posts callbacks from the simulator's event loop; counts sent/failed in `stats`."""

    def __init__(self, stats: Stats) -> None:
        self.stats = stats
        self._client: httpx.AsyncClient | None = None
        self._tasks: set[asyncio.Task[bool]] = set()
        self._last: dict[str, asyncio.Task[bool]] = {}  # message -> its latest callback

    async def start(self) -> None:
        """Create the HTTP client (call inside the serving loop)."""
        self._client = httpx.AsyncClient(
            timeout=10.0, limits=httpx.Limits(max_connections=64, max_keepalive_connections=64)
        )

    async def close(self) -> None:
        """Cancel pending callbacks and close the client."""
        for task in list(self._tasks):
            task.cancel()
        if self._client is not None:
            await self._client.aclose()

    def later(
        self, delay: float, url: str, content: bytes, headers: dict[str, str], retries: int,
        message: str | None = None,
    ) -> None:  # fmt: skip
        """Post `content` to `url` after `delay` seconds; with `message`, also not before the
        previous callback about that message was answered (or given up), so one message's
        callbacks arrive in the order `plan` gave them: only the `out_of_order` fault reorders
        them, not a slow first connection on a busy machine."""
        loop = asyncio.get_running_loop()
        self.stats.callbacks["scheduled"] += 1
        loop.call_later(delay, self._spawn, url, content, headers, retries, message)

    def _spawn(
        self, url: str, content: bytes, headers: dict[str, str], retries: int, message: str | None
    ) -> None:
        previous = self._last.get(message) if message is not None else None
        task = asyncio.ensure_future(self._post_after(previous, url, content, headers, retries))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if message is not None:
            self._last[message] = task
            task.add_done_callback(lambda done: self._forget(message, done))

    def _forget(self, message: str, done: asyncio.Task[bool]) -> None:
        if self._last.get(message) is done:
            del self._last[message]

    async def _post_after(
        self, previous: asyncio.Task[bool] | None, url: str, content: bytes,
        headers: dict[str, str], retries: int,
    ) -> bool:  # fmt: skip
        if previous is not None:
            await asyncio.wait([previous])  # its outcome is its own: counted in stats
        return await self.post(url, content, headers, retries)

    async def post(self, url: str, content: bytes, headers: dict[str, str], retries: int) -> bool:
        """POST now, retrying failures `retries` times with a short backoff."""
        assert self._client is not None, "CallbackPoster.start() not called"
        for attempt in range(retries + 1):
            try:
                resp = await self._client.post(url, content=content, headers=headers)
                if resp.status_code < 300:
                    self.stats.callbacks["sent"] += 1
                    return True
                self.stats.callbacks[f"http_{resp.status_code}"] += 1
            except httpx.HTTPError as exc:
                self.stats.callbacks["transport_error"] += 1
                log.debug("simulator.callback_error error=%s", type(exc).__name__)
            if attempt < retries:
                await asyncio.sleep(0.2 * (2**attempt))
        self.stats.callbacks["failed"] += 1
        return False
