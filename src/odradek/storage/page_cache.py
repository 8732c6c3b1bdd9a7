"""How much of its own writes a log leaves in the page cache: drop-behind (`log.drop.behind.bytes`).

Seed 003, "Persistence": the log is written to the filesystem and the OS page cache holds it; reads of
recent data (followers, consumers at the tail) are served from that cache. Kafka leaves the cache
alone: the kernel keeps what was written until memory runs short.

That is free on a machine whose idle memory is backed by RAM, and costly on a virtual machine whose
hypervisor takes freed memory back (virtio-balloon free page reporting, as Firecracker and cloud
hosts configure it): a page the kernel hands to the page cache from its free lists may have been
returned to the host, and its first write faults into the hypervisor. Measured on such a 2-core VM:
appending 1 MB with pwrite costs 0.2 ms of CPU while the kernel reuses pages it freed moments ago,
and 2.4 ms once it has to take pages the host reclaimed, which a log growing without bound always
does. A 3-broker cluster taking 6 GB of acks=all writes at replication factor 3 spent 8.7 ms of
broker CPU per MB, most of it in that copy; with drop-behind, 4.5-5.1 ms.

Drop-behind keeps the page cache a log uses bounded: once a log's active segment holds more than
`keep_bytes` past the last drop, the pages before its newest `keep_bytes` are dropped with
`posix_fadvise(POSIX_FADV_DONTNEED)`, and a rolled segment is dropped whole once it is flushed and
`keep_bytes` of newer data follow it. The kernel then reuses those freed pages for the next writes.
`DONTNEED` drops only clean pages; for dirty ones it starts their writeback, so they go at the next
drop. The newest `keep_bytes` of every partition stay cached for followers and tailing consumers; a
reader further behind reads from disk. Dropping is only ever a hint to the kernel: no byte of the log
changes, and a file renamed or deleted meanwhile is skipped. The calls run on the log-sync thread.

`log.drop.behind.bytes`: 0, the default, turns it off (Kafka's behaviour); a positive value is
`keep_bytes`; -1 chooses 64 MiB when the hypervisor reclaims free memory (a virtio balloon offering
free page reporting), else off.

`replica.drop.behind.bytes` sets the same for the logs of the partitions a broker follows (a log's
`cache_keep_bytes`, set by the replica manager), with -1 as its default: nobody reads a follower's
log until it leads, so what it keeps cached serves no reader, and replication factor 3 writes two of
its three copies there. 3 GB of 1 KiB acks=all writes at replication factor 3 on the VM above: 191-203
MB/s without it, 293-320 MB/s with the default; the brokers' system CPU fell from 3.9-4.8 to 1.7-1.8
ms per MB.

For every log, it is a trade, which is why it is off unless asked for. On the VM above, with 64 MiB kept (3 brokers,
1 KiB acks=all writes, 6 GB per run, two runs each): replication factor 3 went from 176-177 to
262-298 MB/s, replication factor 1 from 715-717 to 629-697 MB/s. One broker reading back the
500 MB it had just taken went from 743 to 461 MB/s (medians of 3): what the cache no longer holds
comes from disk, into fresh pages.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger("odradek.storage")

AUTO = -1
AUTO_KEEP_BYTES = 64 * 1024 * 1024
MIN_STEP_BYTES = 1024 * 1024
VIRTIO_DEVICES = Path("/sys/bus/virtio/devices")
VIRTIO_BALLOON_F_REPORTING = 5  # the feature bit of free page reporting (virtio spec 5.5.3)


def hypervisor_reclaims_free_memory(devices: Path = VIRTIO_DEVICES) -> bool:
    """A virtio balloon with free page reporting is bound: pages this kernel frees go back to the host."""
    try:
        entries = list(devices.iterdir())
    except OSError:
        return False
    for device in entries:
        try:
            driver = os.path.basename(os.readlink(device / "driver"))
            features = (device / "features").read_text().strip()
        except OSError:
            continue
        if driver == "virtio_balloon" and len(features) > VIRTIO_BALLOON_F_REPORTING \
                and features[VIRTIO_BALLOON_F_REPORTING] == "1":
            return True
    return False


def resolve_keep_bytes(configured: int, devices: Path = VIRTIO_DEVICES, *, key: str = "log.drop.behind.bytes",
                       logs: str = "each log") -> int:
    """`log.drop.behind.bytes` (or `replica.drop.behind.bytes`, for `logs`) as the log manager uses
    it: the bytes kept per log, 0 for off."""
    if configured != AUTO:
        return configured
    if hypervisor_reclaims_free_memory(devices):
        log.info("%s: the hypervisor reclaims free memory (virtio-balloon free page reporting); keeping the "
                 "newest %d MiB of %s in the page cache", key, AUTO_KEEP_BYTES >> 20, logs)
        return AUTO_KEEP_BYTES
    return 0


def step_bytes(keep_bytes: int) -> int:
    """How far a log's active segment grows between two drops."""
    return max(keep_bytes // 2, MIN_STEP_BYTES)


def drop_cached(path: Path, length: int) -> None:
    """Drop the clean cached pages of `path`'s first `length` bytes (0: all of it) and start the
    writeback of its dirty ones. A file gone or renamed meanwhile is skipped."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.posix_fadvise(fd, 0, length, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
