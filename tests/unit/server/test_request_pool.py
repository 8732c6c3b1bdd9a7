"""RequestPool, the broker-wide budget of received, unanswered requests (KIP-72 for
queued.max.request.bytes, plus queued.max.requests): grants, refusals, and the order waiters resume in."""

from __future__ import annotations

from odradek.server.network import RequestPool


class Waiter:
    """Stands in for a Connection: proceeds once the pool grants it `need` bytes."""

    def __init__(self, pool: RequestPool, need: int, log: list) -> None:
        self.pool, self.need, self.log = pool, need, log

    def pool_available(self) -> bool:
        if not self.pool.try_reserve(self.need):
            return False
        self.log.append(self)
        return True


def test_an_empty_pool_grants_one_request_of_any_size():
    pool = RequestPool(bytes_max=100, requests_max=10)
    assert pool.try_reserve(150)
    assert pool.full
    assert not pool.try_reserve(1)


def test_grants_stop_at_the_limit_and_resume_in_arrival_order():
    pool = RequestPool(bytes_max=100, requests_max=10)
    assert pool.try_reserve(60)
    order: list = []
    first, second, third = Waiter(pool, 50, order), Waiter(pool, 10, order), Waiter(pool, 30, order)
    assert not pool.try_reserve(first.need)
    for w in (first, second, third):
        pool.wait(w)
    pool.release(60)
    # first (50) proceeds, then second (10) and third (30) fit in what remains: 50 + 10 + 30 <= 100
    assert order == [first, second, third]


def test_the_head_of_the_queue_keeps_its_place_when_it_still_does_not_fit():
    pool = RequestPool(bytes_max=100, requests_max=10)
    assert pool.try_reserve(90)
    order: list = []
    big, small = Waiter(pool, 80, order), Waiter(pool, 5, order)
    pool.wait(big)
    pool.wait(small)
    pool.charge(5)
    pool.release(5)          # room for small, not for big: nobody overtakes big
    assert order == []
    pool.release(90)
    assert order == [big, small]


def test_queued_max_requests_counts_requests_until_answered():
    pool = RequestPool(bytes_max=1 << 20, requests_max=3)
    pool.add_requests(3)
    assert pool.full
    order: list = []
    w = Waiter(pool, 0, order)
    pool.wait(w)
    pool.release(0, 1)
    assert order == [w] and not pool.full


def test_a_closed_connection_leaves_the_queue():
    pool = RequestPool(bytes_max=10, requests_max=10)
    assert pool.try_reserve(10)
    order: list = []
    w = Waiter(pool, 5, order)
    pool.wait(w)
    pool.forget(w)
    pool.release(10)
    assert order == []
