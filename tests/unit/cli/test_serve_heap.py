"""`odradek serve` settles its heap once the broker has started: start-up garbage is collected and
the survivors are frozen out of the collector's full passes (cli/serve.py, `settle_heap`)."""

from __future__ import annotations

import gc
import weakref

from odradek.cli.serve import settle_heap


class _Node:
    me: object


def test_start_up_cycles_are_collected_and_the_survivors_frozen():
    garbage = _Node()
    garbage.me = garbage
    dead = weakref.ref(garbage)
    del garbage
    live = [_Node() for _ in range(1000)]
    before = gc.get_freeze_count()
    try:
        frozen = settle_heap()
        assert dead() is None
        # The count settle_heap froze. Frozen objects that other threads of the test process drop
        # meanwhile leave the permanent generation, so the count read now can only be lower.
        assert before + len(live) <= frozen and gc.get_freeze_count() <= frozen
        generations = {id(o) for o in gc.get_objects()}
        assert not any(id(node) in generations for node in live)
        survivor = _Node()
        assert id(survivor) in {id(o) for o in gc.get_objects()}   # what comes after is collected as usual
    finally:
        gc.unfreeze()
