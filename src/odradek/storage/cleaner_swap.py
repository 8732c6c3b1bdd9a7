"""Swapping a cleaned segment into a log directory, crash-safe at every step, and finishing or undoing
an interrupted swap when the log is opened again (Kafka's `.cleaned` / `.swap` protocol, LocalLog.
replaceSegments and LogLoader; the order of renames here makes the `.log.swap` file the commit point).

The cleaner writes the replacement of a group of old segments (base offsets B = b0 < b1 < ... < bk)
as `<B>.log.cleaned` with `.index.cleaned` and `.timeindex.cleaned`, fsyncs them, and hands the
segment to the log's owner thread, which swaps it in:

    1. indexes .cleaned -> .swap, then .log.cleaned -> .log.swap; fsync the directory  (commit)
    2. every old segment's files -> .deleted; fsync the directory
    3. indexes .swap -> final names, then .log.swap -> <B>.log

A crash at any point leaves one of these states, which `recover_swaps` (run before the log loads its
segments) resolves:
- `.cleaned` files, or `.swap` indexes without a `.log.swap`: the swap never committed; they are
  removed and the old segments, all still in place, are the log;
- a `<B>.log.swap`: committed. Its last batch ends at E (E = B when it is empty). Every segment file
  (`.log`, `.index`, `.timeindex`, `.txnindex`, renamed or not) whose base offset is in [B, max(E,
  B + 1)) belongs to the old group and is removed; then the `.swap` files take their final names.
  An old segment whose base is at or past E held only records the cleaning removed; keeping it is
  safe (its offsets all lie after E, so nothing overlaps) and the next cleaning removes them again.
  Index files removed here are rebuilt by the log's load.
Segments after the group (base >= bk's end) are never touched; snapshots and checkpoints are not
segment files. The old segments' open descriptors stay readable after the renames (Linux keeps an
open file's data), so a fetch holding one reads valid bytes until the file is closed after
`file.delete.delay.ms`.

Fault points, for the crash tests only: with the environment variable `ODRADEK_CLEANER_FAULT` set to
a step's name, the process exits at once (`os._exit`, status `FAULT_EXIT_CODE`, no clean-up, like a
kill -9) when the cleaner reaches that step. Steps, in order: map-built, cleaned-written,
cleaned-flushed, swap-indexes-renamed, swap-committed, old-segment-deleted, old-segments-deleted,
swap-indexes-final, swapped, checkpoint-written.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from odradek.storage.checkpoints import fsync_dir
from odradek.storage.errors import CorruptRecordError
from odradek.storage.scan import scan_batches
from odradek.storage.segment import CLEANED_SUFFIX, SWAP_SUFFIX, LogSegment

log = logging.getLogger("odradek.storage.cleaner")

FAULT_ENV = "ODRADEK_CLEANER_FAULT"
FAULT_EXIT_CODE = 86
FAULT_STEPS = ("map-built", "cleaned-written", "cleaned-flushed", "swap-indexes-renamed",
               "swap-committed", "old-segment-deleted", "old-segments-deleted",
               "swap-indexes-final", "swapped", "checkpoint-written")
fault_step: str | None = os.environ.get(FAULT_ENV) or None
assert fault_step is None or fault_step in FAULT_STEPS, f"{FAULT_ENV}={fault_step!r}"

_SEGMENT_FILE = re.compile(r"^(\d{20})\.(log|index|timeindex|txnindex)((?:\.cleaned|\.swap|\.deleted)?)$")


def fault_point(step: str) -> None:
    if step == fault_step:
        os.write(2, f"odradek: cleaner fault point {step!r} reached, exiting\n".encode())
        _exit(FAULT_EXIT_CODE)


def _exit(code: int) -> None:  # a seam: unit tests raise instead of ending the test process
    os._exit(code)


def commit_swap(directory: Path, cleaned: LogSegment, old: list[LogSegment]) -> None:
    """Steps 1-3 above; `cleaned` carries the `.cleaned` suffix and is flushed."""
    cleaned.change_suffix(CLEANED_SUFFIX, SWAP_SUFFIX,
                          between=lambda: fault_point("swap-indexes-renamed"))
    fsync_dir(directory)
    fault_point("swap-committed")
    for i, segment in enumerate(old):
        segment.rename_to_deleted()
        if i == 0:
            fault_point("old-segment-deleted")
    fsync_dir(directory)
    fault_point("old-segments-deleted")
    cleaned.change_suffix(SWAP_SUFFIX, "", between=lambda: fault_point("swap-indexes-final"))
    fault_point("swapped")


def remove_cleaned_files(cleaned: LogSegment) -> None:
    """Undo a cleaning that will not be swapped in: close and remove its `.cleaned` files."""
    cleaned.delete()


def recover_swaps(directory: Path) -> None:
    """Resolve what an interrupted cleaning left in `directory` (see the module docstring)."""
    files: dict[int, list[tuple[str, str, str]]] = {}
    for name in os.listdir(directory):
        m = _SEGMENT_FILE.match(name)
        if m:
            files.setdefault(int(m.group(1)), []).append((name, m.group(2), m.group(3)))
    committed = sorted(base for base, names in files.items()
                       if any(kind == "log" and suffix == SWAP_SUFFIX for _, kind, suffix in names))
    for names in files.values():
        for name, _kind, suffix in names:
            uncommitted_swap = suffix == SWAP_SUFFIX and not any(
                k == "log" and s == SWAP_SUFFIX for _, k, s in names)
            if suffix == CLEANED_SUFFIX or uncommitted_swap:
                (directory / name).unlink(missing_ok=True)
    for base in committed:
        end = max(_swap_end_offset(directory / f"{base:020d}.log{SWAP_SUFFIX}", base), base + 1)
        log.info("%s: completing the swap of cleaned segment %d (old segments in [%d, %d))",
                 directory.name, base, base, end)
        for other, names in files.items():
            if base <= other < end:
                for name, _kind, suffix in names:
                    if suffix != SWAP_SUFFIX:
                        (directory / name).unlink(missing_ok=True)
        swaps = sorted((n for n, _k, s in files[base] if s == SWAP_SUFFIX),
                       key=lambda n: n.startswith(f"{base:020d}.log."))  # the .log file last
        for name in swaps:
            if (directory / name).exists():
                os.replace(directory / name, directory / name[:-len(SWAP_SUFFIX)])
    if committed:
        fsync_dir(directory)


def _swap_end_offset(path: Path, base: int) -> int:
    """One past the last offset of the swap segment's last readable batch (base when empty)."""
    end = base
    fd = os.open(path, os.O_RDONLY)
    try:
        for b in scan_batches(fd, 0, os.fstat(fd).st_size):
            end = b.next_offset
    except CorruptRecordError:
        pass  # the log's recovery cuts the torn tail; every complete batch before it counts
    finally:
        os.close(fd)
    return end
