"""Which write path a Spark task takes: whole batches through Producer.send_batch unless compression
is asked for (the Arrow encoder writes uncompressed batches); idempotence keeps whole batches, the
producer stamps them."""

from __future__ import annotations

import pytest

from odradek.client.config import producer_config
from odradek.spark.writer import _asks_for_client_path


class _Producer:
    def __init__(self, **conf) -> None:
        self.config = producer_config({"bootstrap.servers": "localhost:9092", **conf})


@pytest.mark.parametrize("conf, per_record", [
    ({}, False),
    ({"enable.idempotence": True}, False),
    ({"compression.type": "gzip"}, True),
    ({"compression.type": "zstd", "enable.idempotence": True}, True),
    ({"compression.type": "none"}, False),
])
def test_write_path(conf, per_record):
    assert _asks_for_client_path(_Producer(**conf)) is per_record
