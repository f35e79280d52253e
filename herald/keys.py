"""Redis key layout of the API (hot state; Kafka topics stay the source of truth).

Keys holding per-user data carry the user id as a Redis Cluster hash tag (`{user_id}`), so one
user's keys live in one slot and multi-key scripts on them work on a cluster.

    idem:{nid}                  string  "<body sha256>|pending|<ms>" or "...|accepted|<accepted ms>"
                                        TTL idempotency_ttl (24 h); nid = ids.notification_id
    notif:{nid}                 hash    tenant_id, request_id, notification_type, traffic_class,
                                        accepted_at (ms), recipients ("users:<n>" | "segment:<id>"),
                                        otp ("1"|"0"); TTL status_ttl (30 d); the control
                                        fields (control, lease:<seat>, users_planned,
                                        users_total: herald/controls.py)
    status:{nid}                hash    delivery_id -> JSON {state, reason, channel, user_id,
                                        provider, updated_at (RFC 3339)}; written by the
                                        receipts job's status sink (herald/status_keys.py)
    counts:{nid}                hash    state -> deliveries in it now (same script)
    parked:{nid}                list    deliveries held by a pause (herald/controls.py)
    rl:<tenant>:<epoch second>  int     per-tenant request counter, TTL 2 s
    otp:lim:{<kind>:<digest>}   int     OTP sends per phone|ip|device in the current window
    otp:lim:{<kind>:<digest>}:n:<nid>  string  notification nid counted there (plan job, once)
    otp:verified:{nid}          string  set once by POST /v1/otp/{nid}/verified
    otp:stats:<yyyymmddhh>      hash    "<type>:sent" / "<type>:verified" counters, TTL 48 h
    prefs:{user}                string  JSON user_preferences record (copy written after Kafka ack)
    prefs:{user}:version        int     last version handed out (herald.versions; NEXT_VERSION)
    prefs:{user}:lock           string  serializes changes of the preferences (the API's PUT,
                                        the receipts job's opt-outs: sinks/consent.py)
    cp:{user}                   string  JSON contact_points record (copy written after Kafka ack)
    cp:{user}:lock              string  read-modify-write lock of the contact points
    users:{<p>}:pos             hash    "<partition>-<topic>" -> next changelog offset the copies
                                        hold (the users job, dataflows/users.py); <p> = the
                                        Kafka topic prefix (one stack's changelogs)
    users:{<p>}:ready           hash    "<partition>-<topic>" -> 1 once the users job has written
                                        that changelog partition up to its end
    users:{<p>}:restored        string  set when every changelog partition is ready: the copies
                                        hold every user; missing after Redis lost them
    inbox:{user}:items          zset    item_id scored by created_at ms (newest = highest)
    inbox:{user}:data           hash    item_id -> JSON inbox item
    inbox:{user}:unread         set     unread item ids (SCARD = unread count)
    inbox:{user}:undelivered    set     item ids no app has fetched or been pushed yet
    inbox:{user}:events         pubsub  channel: {"type": "item"|"unread", ...} for WebSockets
    segment:{<id>}:lock         string  held while a segment is created or deleted
                                        (api/segments.py), TTL 60 s renewed while it fills

The copies (`prefs:{user}`, `cp:{user}`) are written with `COPY_IF_NEWER` by the API after
Kafka's ack and by the users job from the changelogs, so an older record never replaces a newer
one whichever writes last.

Phone numbers and device ids never appear in key names: OTP limit keys use an HMAC-SHA256 prefix
under the PII key (herald.config.PiiSettings).
"""

from __future__ import annotations

from herald.config import pii_digest
from herald.status_keys import header_key, status_key


def idem(nid: str) -> str:
    return f"idem:{{{nid}}}"


def notif(nid: str) -> str:
    return header_key(nid)  # one home: herald.status_keys


def status(nid: str) -> str:
    return status_key(nid)  # one home: herald.status_keys


def rate(tenant_id: str, second: int) -> str:
    return f"rl:{tenant_id}:{second}"


def otp_limit(kind: str, value: str, key: bytes) -> str:
    """The OTP counter of a phone, IP or device: a keyed digest of it (PII key), never it."""
    return f"otp:lim:{{{kind}:{pii_digest(key, value, 24)}}}"


def otp_charge(limit_key: str, nid: str) -> str:
    """Marks that notification `nid` was counted in `limit_key` (the plan job's charges)."""
    return f"{limit_key}:n:{nid}"


def otp_verified(nid: str) -> str:
    return f"otp:verified:{{{nid}}}"


def otp_stats(hour: str) -> str:
    return f"otp:stats:{hour}"


def prefs(user_id: str) -> str:
    return f"prefs:{{{user_id}}}"


def prefs_version(user_id: str) -> str:
    return f"prefs:{{{user_id}}}:version"


def prefs_lock(user_id: str) -> str:
    return f"prefs:{{{user_id}}}:lock"


def contact_points(user_id: str) -> str:
    return f"cp:{{{user_id}}}"


def contact_points_lock(user_id: str) -> str:
    return f"cp:{{{user_id}}}:lock"


def inbox_items(user_id: str) -> str:
    return f"inbox:{{{user_id}}}:items"


def inbox_data(user_id: str) -> str:
    return f"inbox:{{{user_id}}}:data"


def inbox_unread(user_id: str) -> str:
    return f"inbox:{{{user_id}}}:unread"


def inbox_undelivered(user_id: str) -> str:
    return f"inbox:{{{user_id}}}:undelivered"


def inbox_channel(user_id: str) -> str:
    return f"inbox:{{{user_id}}}:events"


def segment_lock(segment_id: str) -> str:
    return f"segment:{{{segment_id}}}:lock"


def users_positions(topic_prefix: str) -> str:
    return f"users:{{{topic_prefix}}}:pos"


def users_ready(topic_prefix: str) -> str:
    return f"users:{{{topic_prefix}}}:ready"


def users_restored(topic_prefix: str) -> str:
    return f"users:{{{topic_prefix}}}:restored"


# The next version (herald.versions.next_version, atomically). KEYS[1] counter; ARGV[1] now in us
NEXT_VERSION = """
local held = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
local v = math.max(tonumber(ARGV[1]), held + 1)
v = string.format('%d', v)
redis.call('SET', KEYS[1], v)
return v
"""

# Write a copy only when it is newer than what Redis holds. KEYS[1]; ARGV: json, version
COPY_IF_NEWER = """
local cur = redis.call('GET', KEYS[1])
if cur then
  local ok, held = pcall(cjson.decode, cur)
  if ok and tonumber(held['version']) >= tonumber(ARGV[2]) then return 0 end
end
redis.call('SET', KEYS[1], ARGV[1])
return 1
"""
