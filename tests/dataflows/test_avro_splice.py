"""dataflows._avro_splice: byte-identical to fastavro on every Herald schema it serves."""

from __future__ import annotations

import json
import random

import pytest

from dataflows._avro_splice import SpliceEncoder
from dataflows._encode import SPLICED
from schemas import schema_text
from tests.schemas.test_avro_writer import fastavro_bytes, variants


@pytest.mark.parametrize("name", sorted(SPLICED))
def test_spliced_records_match_fastavro(name: str) -> None:
    splice = SpliceEncoder(json.loads(schema_text(name)), SPLICED[name])
    records = variants(name, random.Random(7))
    segments = splice.segments(records[0])
    for i in range(20):
        rec = {**records[0], **{f: f"{f}-{i}-ß" for f in SPLICED[name]}}
        assert splice.encode(segments, rec) == fastavro_bytes(name, rec)


def test_unknown_varying_fields_are_refused_up_front() -> None:
    with pytest.raises(ValueError):
        SpliceEncoder(json.loads(schema_text("delivery")), ["no_such_field"])
