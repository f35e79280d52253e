"""Hostile input against the whole stack: the API, the provider callbacks and the topics.

    python -m bench.hostile [--valid 200]

Starts the stack as an operator does (`herald up`, every job its own process), then sends, in
rounds, `--valid` good notifications between bad inputs of every kind below, and reports:

- per kind, how many bad inputs were tried and how many were answered 5xx (must be 0);
- jobs that crashed (restarts counted by the supervisor; must be 0);
- good notifications accepted (202) that did not reach their provider (must be 0);
- the dead letters the bad records became, by job and reason.

Kinds: the API (malformed JSON, wrong types, unknown fields, oversized bodies, ids with braces,
control or non-ASCII characters, impossible phone numbers, bad link tokens, bad cursors,
unknown keys, unknown routes and methods), the callbacks (unsigned, forged, non-ASCII
signatures, and correctly signed payloads with timestamps of 1e20, inf and nan or nested
garbage), and the topics (bytes that are not Avro, unknown schema ids and records of another
schema on every input topic a job reads, and raw receipts whose timestamps no date holds).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import httpx
import orjson

from bench._fullstack import FullStack, full_stack

__all__ = ["result", "run"]

SENT = frozenset({"PROVIDER_ACCEPTED", "DELIVERED", "READ", "OPENED", "CLICKED"})
INPUT_TOPICS = (
    "herald.requests.transactional", "herald.requests.normal", "herald.requests.bulk",
    "herald.receipts.raw", "herald.delivery-events", "herald.devices", "herald.preferences",
    "herald.deliveries.push.normal", "herald.deliveries.sms.transactional",
    "herald.deliveries.email.bulk", "herald.social-events", "herald.scheduled",
    "herald.retry.normal",
)  # fmt: skip


class Tally:
    """Bad inputs tried per kind, and the 5xx answers among them."""

    def __init__(self) -> None:
        self.tried: Counter[str] = Counter()
        self.server_errors: Counter[str] = Counter()
        self.examples: dict[str, str] = {}

    def http(self, kind: str, response: httpx.Response) -> None:
        self.tried[kind] += 1
        if response.status_code >= 500:
            self.server_errors[kind] += 1
            self.examples.setdefault(kind, f"{response.status_code} {response.text[:200]}")

    def record(self, kind: str, n: int = 1) -> None:
        self.tried[kind] += n


def _api_inputs(user: str) -> Iterator[tuple[str, str, str, dict[str, Any]]]:
    """(kind, method, path, httpx keyword arguments) of bad API requests."""
    good = {"request_id": "r", "notification_type": "order_shipped",
            "recipients": {"user_ids": [user]}, "params": {"order_id": "1"}}  # fmt: skip
    post = "/v1/notifications"
    for body in (b"{", b"[]", b"null", b'{"request_id": 1}', b"\xff\xfe", b'{"a":' * 500):
        yield "api: malformed JSON", "POST", post, {"content": body}
    for field, value in (("recipients", "u"), ("params", [1]), ("send_at", "yesterday"),
                         ("channels", ["pager"]), ("notification_type", 7)):  # fmt: skip
        yield "api: wrong types", "POST", post, {"json": {**good, field: value}}
    yield "api: unknown fields", "POST", post, {"json": {**good, "admin": True}}
    yield "api: oversized body", "POST", post, {"json": {**good, "params": {"x": "y" * 100_000}}}
    for bad in ("u{1}", "u}", "u\x00", "u\n", "ü", "u" * 500, ""):
        yield (
            "api: hostile ids",
            "POST",
            post,
            {
                "json": {
                    **good,
                    "recipients": {"user_ids": [bad]},
                    "request_id": f"r-{random.random()}",
                }
            },
        )
        path = f"/v1/users/{quote(bad, safe='') or 'x'}/preferences"  # as a client encodes it
        yield "api: hostile ids", "PUT", path, {"json": {}}
    for phone in ("+1٤١٥5550123x", "+0", "0791234567", "+41 79", "+" + "9" * 30, "+1\x00"):
        yield (
            "api: impossible phones",
            "PUT",
            f"/v1/users/{user}/contact-points",
            {"json": {"phone": {"e164": phone}}},
        )
    for path in ("/t/o/x.gif", "/t/c/a.b", "/t/p/" + "A" * 5000, "/v1/unsubscribe/%00.%ff"):
        yield "api: bad link tokens", "GET" if "/p/" not in path else "POST", path, {}
    yield "api: bad cursors", "GET", f"/v1/users/{user}/inbox", {"params": {"cursor": "\x00"}}
    yield "api: bad keys", "GET", "/v1/notifications/x", {"headers": {"X-API-Key": "k" * 300}}
    yield (
        "api: bad keys",
        "GET",
        f"/v1/users/{user}/inbox",
        {"headers": {"Authorization": "Bearer hu_AAAA.BBBB"}},
    )
    for method, path in (("DELETE", post), ("PATCH", "/v1/users/x/preferences"), ("GET", "/..%2f")):
        yield "api: unknown routes and methods", method, path, {}
    yield "api: huge query", "GET", f"/v1/users/{user}/inbox", {"params": {"limit": "9" * 400}}


def _callback_inputs(stack: FullStack) -> Iterator[tuple[str, str, bytes, dict[str, Any]]]:
    """(kind, provider, body, headers) of bad callbacks, some correctly signed."""
    from infra.simulators.receipts import sign_twilio, sign_vonage

    api = stack.state["urls"]["api"]
    sims = stack.run_dir / "simulators"
    twilio = json.loads((sims / "sms_a" / "credentials.json").read_text())
    vonage = json.loads((sims / "sms_b" / "credentials.json").read_text())
    form = {"content-type": "application/x-www-form-urlencoded"}
    params = {"MessageSid": "SMx", "MessageStatus": "delivered"}
    yield "callbacks: unsigned", "sms_a", urlencode(params).encode(), form
    yield (
        "callbacks: forged",
        "sms_a",
        urlencode(params).encode(),
        {**form, "x-twilio-signature": "Zm9yZ2Vk"},
    )
    yield (
        "callbacks: non-ASCII signatures",
        "sms_a",
        urlencode(params).encode(),
        {**form, "x-twilio-signature": "sïg".encode()},
    )
    yield (
        "callbacks: non-ASCII signatures",
        "email",
        b"[]",
        {
            "x-twilio-email-event-webhook-timestamp": str(int(time.time())),
            "x-twilio-email-event-webhook-signature": "ÿÿ".encode("latin-1"),
        },
    )
    yield "callbacks: oversized", "email", b"[" + b"{}," * 600_000 + b"{}]", {}
    for stamp in ("1e20", "inf", "nan", "-1", "99999999999999999999"):
        signed = {"MessageSid": f"SM{random.random()}", "MessageStatus": "delivered",
                  "RawDlrDoneDate": stamp, "ErrorCode": stamp}  # fmt: skip
        url = f"{api}/v1/callbacks/sms_a"
        yield (
            "callbacks: signed hostile payloads",
            "sms_a",
            urlencode(signed).encode(),
            {**form, "x-twilio-signature": sign_twilio(twilio["auth_token"], url, signed)},
        )
        dlr = {"messageId": f"m{random.random()}", "status": "delivered",
               "message-timestamp": stamp, "timestamp": str(int(time.time())),
               "client-ref": "{}" * 50}  # fmt: skip
        dlr["sig"] = sign_vonage(vonage["signature_secret"], dlr, vonage["signature_method"])
        yield "callbacks: signed hostile payloads", "sms_b", urlencode(dlr).encode(), form


def _topic_records(stack: FullStack) -> Iterator[tuple[str, str, bytes]]:
    """(kind, logical topic, value) of bad records."""
    from schemas.registry import make_registry
    from sinks.kafka import topic_serializer

    registry = make_registry(stack.settings.registry)
    for topic in INPUT_TOPICS:
        yield "topics: not Avro", topic, b"\x00garbage"
        yield "topics: not Avro", topic, b""
        yield "topics: unknown schema id", topic, b"\x00\x7f\xff\xff\xff" + b"\x02" * 20
    other = topic_serializer(stack.settings.kafka, registry, "herald.preferences")
    wrong = other({"user_id": "u", "updated_at": 0, "version": 1})
    for topic in INPUT_TOPICS:
        if topic != "herald.preferences":
            yield "topics: a record of another schema", topic, wrong
    raw = topic_serializer(stack.settings.kafka, registry, "herald.receipts.raw")
    for stamp in (1e20, float("inf"), float("nan"), -1, 10**30):
        item = {"event": "delivered", "sg_message_id": "x.y", "timestamp": stamp,
                "sg_event_id": f"h-{random.random()}"}  # fmt: skip
        body = json.dumps([item]).encode()  # inf and nan as JSON's extensions
        record = {"receipt_id": f"h-{random.random()}", "provider": "email",
                  "received_at": 0, "content_type": "application/json", "headers": {},
                  "body": body, "signature_valid": True, "remote_addr": None}  # fmt: skip
        yield "topics: raw receipts no date holds", "herald.receipts.raw", raw(record)


def _good(user: str) -> dict[str, Any]:
    return {"request_id": f"good-{user}", "notification_type": "order_shipped",
            "recipients": {"user_ids": [user]}, "params": {"order_id": user}}  # fmt: skip


def _restarts(stack: FullStack) -> dict[str, int]:
    from infra.stack import read_state

    state = read_state(stack.run_dir) or {}
    return {name: int(c.get("restarts", 0)) for name, c in state.get("components", {}).items()}


def _produce(stack: FullStack, records: list[tuple[str, str, bytes]]) -> None:
    from confluent_kafka import Producer

    kafka = stack.settings.kafka
    producer = Producer({**kafka.client_config(), "acks": "all"})
    for _kind, topic, value in records:
        producer.produce(kafka.topic(topic), value=value, key=b"hostile")
    if producer.flush(30):
        raise RuntimeError("hostile records not acknowledged by Kafka")


def _sent(stack: FullStack, nids: list[str], timeout: float) -> list[str]:
    """The notifications of `nids` with no delivery at its provider within `timeout`."""
    waiting = set(nids)
    deadline = time.monotonic() + timeout
    while waiting and time.monotonic() < deadline:
        for nid in list(waiting):
            resp = stack.api.get(f"/v1/notifications/{nid}", params={"limit": 10})
            states = (
                {d["state"] for d in resp.json().get("deliveries", [])}
                if resp.is_success
                else set()
            )
            if states & SENT:
                waiting.discard(nid)
        if waiting:
            time.sleep(0.5)
    return sorted(waiting)


def run(valid: int = 200, progress: Callable[[str], None] = print) -> dict[str, Any]:
    """The scenario on a fresh stack; its figures."""
    tally = Tally()
    with (
        tempfile.TemporaryDirectory(prefix="herald-hostile-") as tmp,
        full_stack(Path(tmp) / "run") as stack,
    ):
        users = [f"hostile-{i}" for i in range(valid)]
        stack.produce_contact_points(users)
        before = _restarts(stack)
        api = httpx.Client(base_url=stack.state["urls"]["api"], timeout=30,
                           headers={"X-API-Key": stack.api.headers["X-API-Key"]})  # fmt: skip
        api_inputs = list(_api_inputs(users[0]))
        callbacks = list(_callback_inputs(stack))
        topics = list(_topic_records(stack))
        nids: list[str] = []
        rounds = 10
        for r in range(rounds):
            progress(f"hostile: round {r + 1}/{rounds}")
            for kind, method, path, kwargs in api_inputs:
                tally.http(kind, api.request(method, path, **kwargs))
            for kind, provider, body, headers in callbacks:
                tally.http(kind, api.post(f"/v1/callbacks/{provider}", content=body,
                                          headers=headers))  # fmt: skip
            if r % 3 == 0:
                _produce(stack, topics)
                for kind, _topic, _value in topics:
                    tally.record(kind)
            for user in users[r::rounds]:
                nids.append(stack.post(_good(user))[0])
        progress(f"hostile: waiting for the {len(nids)} good notifications")
        lost = _sent(stack, nids, timeout=180)
        after = _restarts(stack)
        letters = Counter((d["job"], d["reason"]) for d in stack.records("herald.dead-letters"))
        api.close()
    crashed = {name: after.get(name, 0) - n for name, n in before.items() if after.get(name, 0) > n}
    return {
        "tried": dict(tally.tried),
        "server_errors": dict(tally.server_errors),
        "server_error_examples": tally.examples,
        "crashed_jobs": crashed,
        "good_accepted": len(nids),
        "good_lost": lost,
        "dead_letters": {f"{job}: {reason}": n for (job, reason), n in sorted(letters.items())},
    }


def _table(f: dict[str, Any]) -> list[str]:
    lines = [f"  {'bad inputs of each kind':<44} tried  5xx"]
    for kind, n in sorted(f["tried"].items()):
        lines.append(f"  {kind:<44} {n:>5}  {f['server_errors'].get(kind, 0):>3}")
    lines.append(f"  {'jobs crashed (supervisor restarts)':<44} {len(f['crashed_jobs'])}"
                 + (f" {f['crashed_jobs']}" if f["crashed_jobs"] else ""))  # fmt: skip
    lines.append(f"  {'good notifications accepted / lost':<44} {f['good_accepted']} / "
                 f"{len(f['good_lost'])}")  # fmt: skip
    lines.append("  dead letters, by job and reason:")
    lines += [f"    {name:<42} {n}" for name, n in f["dead_letters"].items()]
    return lines


def result(quick: bool = False) -> dict[str, Any]:
    """The scenario for `make bench` (bench/__main__.py)."""
    from bench._report import figure
    from bench._report import result as make_result

    f = run(20 if quick else 200)
    figures = [
        figure("bad inputs tried (API, callbacks, topics)", sum(f["tried"].values()), "inputs"),
        figure("5xx answers to them", sum(f["server_errors"].values()), "", better="lower",
               target="0"),
        figure("jobs crashed", len(f["crashed_jobs"]), "", better="lower", target="0"),
        figure("good notifications lost (of those accepted meanwhile)", len(f["good_lost"]), "",
               better="lower", target="0"),
    ]  # fmt: skip
    return make_result("Hostile input against the whole stack", figures, notes=_table(f),
                       details=f)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.hostile`."""
    parser = argparse.ArgumentParser(prog="python -m bench.hostile", description=__doc__)
    parser.add_argument("--valid", type=int, default=200, help="good notifications sent")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    figures = run(args.valid, progress=lambda m: print(m, file=sys.stderr, flush=True))
    print(f"\n== hostile input against the whole stack ({os.cpu_count()} cores)")
    print("\n".join(_table(figures)))
    if figures["server_error_examples"]:
        print("  5xx examples:", json.dumps(figures["server_error_examples"], indent=2))
    if args.json:
        args.json.write_text(orjson.dumps(figures, option=orjson.OPT_INDENT_2).decode())
    bad = figures["server_errors"] or figures["crashed_jobs"] or figures["good_lost"]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
