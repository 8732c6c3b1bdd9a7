"""Record batches (v2) and legacy message sets (v0, v1): views, builders, CRCs, codecs, conversions.

Pure code: no sockets, no clocks. Every malformed input raises `odradek.protocol.exceptions.ProtocolError`.

- `header`: the v2 batch header read and patched in place (the broker's hot path).
- `batch`: `RecordBatch` view and lazy `Record` iteration; `builder`: `RecordBatchBuilder`;
  `buffer_pool`: reusable builder buffers for a producer.
- `control`: transaction markers; `legacy` / `legacy_builder`: magic 0 and 1 message sets.
- `record_set`: iterate the mixed entries of a record set; `convert`: legacy <-> v2.
- `codecs` (with `lz4frame`): none, gzip, snappy, lz4, zstd, each decompression size-capped.
- `varint`: zig-zag varints and varlongs.
"""

from odradek.records.batch import Record, RecordBatch
from odradek.records.builder import RecordBatchBuilder
from odradek.records.codecs import DEFAULT_MAX_UNCOMPRESSED_BYTES, GZIP, LZ4, NONE, SNAPPY, ZSTD
from odradek.records.control import ABORT, COMMIT, EndTransactionMarker, build_end_txn_marker_batch
from odradek.records.convert import legacy_to_v2, v2_to_legacy
from odradek.records.header import BatchHeader, iter_headers
from odradek.records.legacy import LegacyBatch, LegacyRecord
from odradek.records.legacy_builder import LegacyBuilder
from odradek.records.record_set import ensure_valid, iter_batches, iter_records

__all__ = [
    "ABORT", "COMMIT", "DEFAULT_MAX_UNCOMPRESSED_BYTES", "GZIP", "LZ4", "NONE", "SNAPPY", "ZSTD",
    "BatchHeader", "EndTransactionMarker", "LegacyBatch", "LegacyBuilder", "LegacyRecord", "Record",
    "RecordBatch", "RecordBatchBuilder", "build_end_txn_marker_batch", "ensure_valid", "iter_batches",
    "iter_headers", "iter_records", "legacy_to_v2", "v2_to_legacy",
]
