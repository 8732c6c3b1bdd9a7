"""What the consumer hands out from a fetched record set: control and aborted batches skipped,
positions advanced past them, batches before the fetch offset dropped."""

from __future__ import annotations

from types import SimpleNamespace

from odradek.client.fetcher import CompletedFetch, PartitionState, TopicPartition, records_of, to_fetched_batch
from odradek.records import ABORT, COMMIT, EndTransactionMarker, RecordBatchBuilder, build_end_txn_marker_batch


def batch(base: int, n: int, *, pid: int = -1, txn: bool = False) -> bytes:
    b = RecordBatchBuilder(base_offset=base, producer_id=pid, producer_epoch=0 if pid >= 0 else -1,
                           base_sequence=0 if pid >= 0 else -1, is_transactional=txn)
    for i in range(n):
        b.append(None, f"v{base + i}".encode(), timestamp=1000 + base + i)
    return b.build()


def marker(offset: int, pid: int, kind: int) -> bytes:
    return build_end_txn_marker_batch(EndTransactionMarker(kind, 0), producer_id=pid, producer_epoch=0,
                                      timestamp=5, base_offset=offset)


def handed_out(data: bytes, fetch_offset: int, *, read_committed: bool, aborted=()):
    st = PartitionState(TopicPartition("t", 0))
    st.seek(fetch_offset)
    cf = CompletedFetch(st, memoryview(data), fetch_offset, 100,
                        [SimpleNamespace(producer_id=p, first_offset=o) for p, o in aborted],
                        read_committed, True)
    out = []
    while (entry := cf.next_batch()) is not None:
        out += [r.offset for r in records_of(cf.tp, entry, fetch_offset, False)]
    return out, cf


def test_read_committed_skips_aborted_transactions_and_markers():
    data = (batch(0, 2) + batch(2, 2, pid=7, txn=True) + batch(4, 1, pid=8, txn=True)
            + marker(5, 7, ABORT) + marker(6, 8, COMMIT) + batch(7, 2, pid=7, txn=True) + marker(9, 7, COMMIT))
    committed, cf = handed_out(data, 0, read_committed=True, aborted=[(7, 2)])
    assert committed == [0, 1, 4, 7, 8]
    assert cf.next_offset == 10          # the position moves past the markers
    uncommitted, _ = handed_out(data, 0, read_committed=False, aborted=[(7, 2)])
    assert uncommitted == [0, 1, 2, 3, 4, 7, 8]


def test_fetch_offset_inside_a_batch_and_partial_tail():
    data = batch(0, 5) + batch(5, 5)
    got, cf = handed_out(data + data[:30], 3, read_committed=False)
    assert got == [3, 4, 5, 6, 7, 8, 9]
    assert cf.scan_end() == 10
    fb = to_fetched_batch(cf.tp, next(iter(CompletedFetch(cf.state, memoryview(data), 3, 10, None, False,
                                                            True)._iter)), 3, 10)
    assert (fb.base_offset, fb.first_offset, fb.next_offset, fb.records_count) == (0, 3, 5, 5)
    assert bytes(fb.data) == data[:len(batch(0, 5))]
    assert [r.offset for r in fb.records()] == [3, 4]


def test_partition_state_epochs():
    st = PartitionState(TopicPartition("t", 0))
    assert not st.fetchable(0)
    st.seek(5)
    e = st.epoch
    assert st.fetchable(0) and st.position == st.fetch_offset == 5
    st.paused = True
    assert not st.fetchable(0)
    st.paused = False
    st.request_reset("earliest")
    assert st.epoch == e + 1 and st.position is None and not st.fetchable(0)
