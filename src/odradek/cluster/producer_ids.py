"""Producer ids for InitProducerId, handed out from blocks of 1,000 (Kafka's ZooKeeper-era
ProducerIdManager; KIP-98).

The last block claimed is the node

    /latest_producer_id_block   {"version": 1, "broker": <broker id>, "block_start": "<first>", "block_end": "<last>"}

(Kafka's ProducerIdBlockZNode: both ends inclusive, written as decimal strings). A broker claims the
next block, [block_end + 1, block_end + 1000], with one conditional write on the node's version (or
creates the node with [0, 999]), then hands the ids out from memory: one store write per 1,000 ids,
and ids never repeat across restarts, since a restart claims a fresh block.

`claim_block` does the store I/O and returns the block; `install` makes it current. The broker runs
the first on its worker pool and the second on the event loop, so `next_id` (event loop) never sees a
half-installed block.
"""

from __future__ import annotations

from dataclasses import dataclass

from odradek.cluster.store import BadVersionError, Create, MetadataStore, NodeExistsError, NoNodeError, \
    SetData, StoreError

PRODUCER_ID_BLOCK_PATH = "/latest_producer_id_block"
PRODUCER_ID_BLOCK_SIZE = 1000
MAX_PRODUCER_ID = 2**63 - 1
_CLAIM_ATTEMPTS = 10


@dataclass(frozen=True)
class ProducerIdBlock:
    broker: int
    block_start: int
    block_end: int        # inclusive

    def node(self) -> dict:
        return {"version": 1, "broker": self.broker, "block_start": str(self.block_start),
                "block_end": str(self.block_end)}


def parse_block(value: dict) -> int:
    """The first id after the block a node describes. Earlier versions kept {"next": <id>}."""
    if "block_end" in value:
        return int(value["block_end"]) + 1
    return int(value.get("next", 0))


class ProducerIdManager:
    def __init__(self, store: MetadataStore, broker_id: int, block_size: int = PRODUCER_ID_BLOCK_SIZE) -> None:
        self.store = store
        self.broker_id = broker_id
        self.block_size = block_size
        self._next = 0
        self._end = -1          # inclusive; nothing in hand until a block is installed

    def next_id(self) -> int | None:
        """The next id of the current block, or None when the block is used up (claim another)."""
        pid = self._next
        if pid > self._end:
            return None
        self._next = pid + 1
        return pid

    def claim_block(self) -> ProducerIdBlock:
        """Claim the next block in the store. Raises StoreError if it cannot be written."""
        for _ in range(_CLAIM_ATTEMPTS):
            try:
                value, version = self.store.get(PRODUCER_ID_BLOCK_PATH)
            except NoNodeError:
                value, version = None, -1
            start = 0 if value is None else parse_block(value)
            if start > MAX_PRODUCER_ID - self.block_size:
                raise StoreError("producer ids are exhausted")
            block = ProducerIdBlock(self.broker_id, start, start + self.block_size - 1)
            op = Create(PRODUCER_ID_BLOCK_PATH, block.node()) if value is None else \
                SetData(PRODUCER_ID_BLOCK_PATH, block.node(), version)
            try:
                self.store.multi([op])
                return block
            except (BadVersionError, NodeExistsError, NoNodeError):
                continue      # another broker claimed a block meanwhile: read again
        raise StoreError("could not claim a producer id block: the store kept changing")

    def install(self, block: ProducerIdBlock) -> None:
        self._end = -1
        self._next = block.block_start
        self._end = block.block_end
