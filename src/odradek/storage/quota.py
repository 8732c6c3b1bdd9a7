"""A byte rate measured over sampled windows, and an upper bound on it (seed 003, "Quotas": "Byte-rate
... measured over multiple small windows"; Kafka's Rate over a SampledStat with a Quota, the way its
ReplicationQuotaManager throttles a replica move between log dirs, `replica.alter.log.dirs.io.max.bytes.per.second`).

The rate keeps `samples` windows of `window_ms` each. A byte count is added to the current window,
which is closed once `window_ms` passed since it opened; a new one then opens (reusing the oldest
slot once all `samples` exist). A window opened `samples * window_ms` ago or earlier is forgotten
(reset to now). The rate is the bytes of every window kept over the time since the oldest window
opened, counted as at least `samples - 1` whole windows, so a quota just set does not shut the copy
at its first step: with Kafka's defaults (11 windows of 1 s) the first 10 s worth of the rate may go
at once, and after that the rate over the last windows stays at the bound.

The quota is exceeded while the rate is above the bound (a rate equal to it is still allowed, and so is
anything while nothing was counted recently: a bound of 0 lets one step through per `samples *
window_ms`, as in Kafka). Callers count bytes after they pass the check, and check before their next
step; no clock is read here: every call takes the caller's `now_ms`. Not thread-safe: one caller.
"""

from __future__ import annotations

from dataclasses import dataclass

UNBOUNDED = 2**63 - 1     # Kafka's Long.MAX_VALUE default of the replication quotas: no throttle


@dataclass(slots=True)
class _Window:
    opened_ms: int
    value: float = 0.0

    def reset(self, now_ms: int) -> None:
        self.opened_ms = now_ms
        self.value = 0.0


class SampledRate:
    """Bytes per second over the last `samples` windows of `window_ms` (Kafka's Rate of a WindowedSum)."""

    def __init__(self, samples: int = 11, window_ms: int = 1000) -> None:
        if samples < 1 or window_ms < 1:
            raise ValueError(f"a rate needs at least one window of at least 1 ms: {samples} x {window_ms} ms")
        self.samples = samples
        self.window_ms = window_ms
        self._windows: list[_Window] = []
        self._current = 0

    def record(self, value: float, now_ms: int) -> None:
        window = self._current_window(now_ms)
        if now_ms - window.opened_ms >= self.window_ms:
            window = self._advance(now_ms)
        window.value += value

    def measure(self, now_ms: int) -> float:
        """The rate in units per second at `now_ms`."""
        self._forget_old(now_ms)
        total = sum(w.value for w in self._windows)
        elapsed_ms = now_ms - self._oldest(now_ms).opened_ms
        full_windows = elapsed_ms // self.window_ms
        if full_windows < self.samples - 1:
            elapsed_ms += (self.samples - 1 - full_windows) * self.window_ms
        if elapsed_ms <= 0:                 # one window of its first millisecond
            return 0.0 if total == 0 else float("inf")
        return total * 1000.0 / elapsed_ms

    def _current_window(self, now_ms: int) -> _Window:
        if not self._windows:
            self._windows.append(_Window(now_ms))
        return self._windows[self._current]

    def _advance(self, now_ms: int) -> _Window:
        self._current = (self._current + 1) % self.samples
        if self._current >= len(self._windows):
            self._windows.append(_Window(now_ms))
        else:
            self._windows[self._current].reset(now_ms)
        return self._windows[self._current]

    def _oldest(self, now_ms: int) -> _Window:
        if not self._windows:
            self._windows.append(_Window(now_ms))
        return min(self._windows, key=lambda w: w.opened_ms)

    def _forget_old(self, now_ms: int) -> None:
        expire_ms = self.samples * self.window_ms
        for w in self._windows:
            if now_ms - w.opened_ms >= expire_ms:
                w.reset(now_ms)


class ByteRateQuota:
    """An upper bound in bytes per second on a SampledRate; UNBOUNDED (Kafka's default) never throttles."""

    def __init__(self, bytes_per_second: int = UNBOUNDED, samples: int = 11, window_ms: int = 1000) -> None:
        self.rate = SampledRate(samples, window_ms)
        self.bytes_per_second = bytes_per_second
        self.recorded_bytes = 0       # every byte counted, for the operator (throttled or not)
        self.throttled_checks = 0     # checks that found the bound exceeded

    @property
    def bounded(self) -> bool:
        return self.bytes_per_second < UNBOUNDED

    def update(self, bytes_per_second: int) -> None:
        """A new bound: the next check uses it; what was counted stays counted."""
        if bytes_per_second < 0:
            raise ValueError(f"a byte rate quota cannot be negative: {bytes_per_second}")
        self.bytes_per_second = bytes_per_second

    def record(self, nbytes: int, now_ms: int) -> None:
        self.recorded_bytes += nbytes
        self.rate.record(nbytes, now_ms)

    def exceeded(self, now_ms: int) -> bool:
        """Whether the rate is above the bound now (the caller then waits for a later check)."""
        if not self.bounded:
            return False
        over = self.rate.measure(now_ms) > self.bytes_per_second
        if over:
            self.throttled_checks += 1
        return over
