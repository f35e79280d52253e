"""Prometheus counting for the planning jobs, once per batch (herald.metrics series).

    CountOutputs(job)   pass-through batch step: herald_events_total{state},
                        herald_suppressed_total{reason}, herald_dead_letters_total{reason}

Placed right before the Kafka output, so it counts what is handed to the producer (replays after
a restart are counted again: the series count work done, the topics carry the facts).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from herald.metrics import JobMetrics
from herald.topics import DELIVERY_EVENTS
from sinks.kafka import KafkaRecord

__all__ = ["CountOutputs"]


class CountOutputs:
    """Count a batch of events (`Output`s of herald.delivery-events) and dead letters; pass it on.

    Used as a `flat_map_batch` mapper over items that are `Output`, `KafkaRecord` or dead-letter
    dicts; only event Outputs and dead letters are counted.
    """

    def __init__(
        self,
        job: str,
        *,
        events: bool = True,
        dead_letters: bool = True,
        events_topic: str = DELIVERY_EVENTS,
    ) -> None:
        self.metrics = JobMetrics(job)
        self.events = events
        self.dead_letters = dead_letters
        self.events_topic = events_topic

    def __call__(self, batch: list[Any]) -> list[Any]:
        states: Counter[str] = Counter()
        suppressed: Counter[str] = Counter()
        letters: Counter[str] = Counter()
        for item in batch:
            if isinstance(item, dict):
                if self.dead_letters:
                    letters[item["reason"]] += 1
            elif (
                self.events
                and not isinstance(item, KafkaRecord)
                and item.topic == self.events_topic
            ):
                states[item.value["state"]] += 1
                if item.value["state"] == "SUPPRESSED":
                    suppressed[item.value["reason"]] += 1
        self.add(states, suppressed, letters)
        return batch

    def add(
        self, states: Counter[str], suppressed: Counter[str], letters: Counter[str] | None = None
    ) -> None:
        """Count events by state, SUPPRESSED events by reason and dead letters by reason
        (for a step that emits encoded events: dataflows/plan/planner.py)."""
        for state, n in states.items():
            self.metrics.event(state, n)
        for reason, n in suppressed.items():
            self.metrics.suppressed(reason, n)
        for reason, n in (letters or {}).items():
            self.metrics.dead_letter(reason, n)
