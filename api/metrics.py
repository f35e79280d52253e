"""Prometheus metrics of one API app (own registry, so several apps can share a process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class ApiMetrics:
    """Counters exposed at GET /metrics."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.accepted = Counter(
            "herald_api_notifications_accepted", "Requests made durable (202).", ["traffic_class"],
            registry=r,
        )  # fmt: skip
        self.replayed = Counter(
            "herald_api_notifications_replayed", "Idempotent replays answered 202.", registry=r
        )
        self.rejected = Counter(
            "herald_api_rejected", "Requests answered 4xx by code.", ["code"], registry=r
        )
        self.unavailable = Counter(
            "herald_api_unavailable", "Requests answered 503 (Kafka/Redis down).", ["cause"],
            registry=r,
        )  # fmt: skip
        self.callbacks = Counter(
            "herald_api_callbacks", "Provider callbacks appended to raw receipts.", ["provider"],
            registry=r,
        )  # fmt: skip
        self.callbacks_rejected = Counter(
            "herald_api_callbacks_rejected",
            "Provider callbacks rejected (forged or missing signature).",
            ["provider", "reason"],
            registry=r,
        )
        self.tracking = Counter(
            "herald_api_tracking_events", "Open/click tracking events emitted.", ["kind"],
            registry=r,
        )  # fmt: skip
        self.tracking_rejected = Counter(
            "herald_api_tracking_rejected", "Tampered or malformed tracking tokens.", ["kind"],
            registry=r,
        )  # fmt: skip
        self.otp_sent = Counter(
            "herald_otp_sent", "OTP notifications accepted.", ["notification_type"], registry=r
        )
        self.otp_verified = Counter(
            "herald_otp_verified", "OTP notifications reported verified.", ["notification_type"],
            registry=r,
        )  # fmt: skip
        self.otp_limited = Counter(
            "herald_otp_rate_limited", "OTP sends refused by a per-phone/IP/device limit.",
            ["dimension"], registry=r,
        )  # fmt: skip
        self.otp_unverified_ratio = Gauge(
            "herald_otp_unverified_ratio",
            "Share of OTPs sent in the last 24 h that were never verified (SMS pumping signal; "
            "all API instances, from Redis).",
            ["notification_type"],
            registry=r,
        )
        self.otp_sent_24h = Gauge(
            "herald_otp_sent_24h", "OTPs sent in the last 24 h (all instances).",
            ["notification_type"], registry=r,
        )  # fmt: skip
