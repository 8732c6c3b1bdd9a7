"""The sampled byte rate and its quota (storage/quota.py), as Kafka measures a Rate over a SampledStat:
the rate counts at least `samples - 1` whole windows, windows are forgotten `samples` windows after
they opened, a rate equal to the bound is allowed. Every value here follows from those rules; the
clock is the caller's."""

from __future__ import annotations

import pytest

from odradek.storage.quota import UNBOUNDED, ByteRateQuota, SampledRate


def test_a_rate_counts_at_least_all_but_one_window():
    rate = SampledRate(samples=11, window_ms=1000)
    assert rate.measure(0) == 0.0
    rate.record(10_000, now_ms=0)
    assert rate.measure(0) == 10_000 / 10          # 10 whole windows at least
    assert rate.measure(5_000) == 10_000 / 10
    assert rate.measure(10_000) == 10_000 / 10
    assert rate.measure(10_500) == 10_000 / 10.5     # the time since the oldest window opened
    assert rate.measure(11_000) == 0.0               # that window is forgotten 11 windows after it opened


def test_bytes_go_to_the_window_open_at_the_time_and_old_windows_are_forgotten():
    rate = SampledRate(samples=11, window_ms=1000)
    rate.record(100, now_ms=0)
    rate.record(100, now_ms=999)          # the same window
    rate.record(100, now_ms=1_500)        # the first one is closed: a new window opens at 1.5 s
    assert rate.measure(2_000) == 300 / 10
    # at 11 s the first window is forgotten; the one of 1.5 s is the oldest (9.5 s, counted as 10.5)
    assert rate.measure(11_000) == 100 / 10.5
    assert rate.measure(12_500) == 0.0


def test_windows_are_reused_in_turn():
    rate = SampledRate(samples=2, window_ms=1000)
    rate.record(1, now_ms=0)
    rate.record(2, now_ms=1_000)
    rate.record(4, now_ms=2_000)          # reuses the slot of the first window
    assert rate.measure(2_000) == (2 + 4) / 1.0
    assert rate.measure(2_999) == (2 + 4) / 1.999


def test_one_window_of_its_first_millisecond():
    rate = SampledRate(samples=1, window_ms=1000)
    assert rate.measure(0) == 0.0
    rate.record(1, now_ms=0)
    assert rate.measure(0) == float("inf")
    assert rate.measure(500) == 1 / 0.5
    with pytest.raises(ValueError):
        SampledRate(samples=0, window_ms=1000)


def test_a_quota_is_exceeded_above_its_bound_only():
    quota = ByteRateQuota(1_000, samples=11, window_ms=1000)
    quota.record(10_000, now_ms=0)
    assert not quota.exceeded(0)          # 1000/s: at the bound
    quota.record(1, now_ms=0)
    assert quota.exceeded(0)              # 10001 over 10 s
    assert not quota.exceeded(1)          # 10001 over 10.001 s
    quota.record(9_999, now_ms=1)
    assert quota.exceeded(1) and quota.exceeded(10_999)     # 20000 over at most 11 s
    assert not quota.exceeded(11_000)     # forgotten with its window
    assert quota.throttled_checks == 3 and quota.recorded_bytes == 20_000


def test_a_bound_of_zero_lets_one_step_through_per_forgotten_windows():
    quota = ByteRateQuota(0, samples=2, window_ms=1000)
    assert not quota.exceeded(0)
    quota.record(4096, now_ms=0)
    assert quota.exceeded(1) and quota.exceeded(1_999)
    assert not quota.exceeded(2_000)


def test_unbounded_never_throttles_and_a_new_bound_applies_at_the_next_check():
    quota = ByteRateQuota(samples=2, window_ms=1000)
    assert quota.bytes_per_second == UNBOUNDED and not quota.bounded
    quota.record(10**15, now_ms=0)
    assert not quota.exceeded(0)
    quota.update(1_000)                   # the bytes counted before count against the new bound
    assert quota.exceeded(1)
    quota.update(UNBOUNDED)
    assert not quota.exceeded(2)
    with pytest.raises(ValueError):
        quota.update(-1)
