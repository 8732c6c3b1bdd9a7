"""Incremental fetch sessions (KIP-227).

A client that sends session_epoch 0 asks for a new session holding the request's partitions; later
requests with the session id and the next epoch name only the partitions whose fetch position
changed (and the ones to forget), and the response carries only the partitions with something new:
records, a moved high watermark, last stable offset or log start offset, or an error. Epoch -1 means
no session (a full fetch). Unknown ids get FETCH_SESSION_ID_NOT_FOUND, a wrong epoch
INVALID_FETCH_SESSION_EPOCH. The cache holds at most `max.incremental.fetch.session.cache.slots`
sessions; the least recently used goes first.
"""

from __future__ import annotations

import collections
import itertools
import uuid
from typing import Any, Protocol

from odradek.cluster.topics import TopicInfo
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages.fetch import FetchableTopicResponse, FetchRequest

# [(topic name or None if its id is unknown, topic id, [FetchPartition])]
Wanted = list[tuple[str | None, uuid.UUID | None, list[Any]]]


class TopicIds(Protocol):
    """Where topic ids resolve (the metadata cache)."""

    def topic_by_id(self, topic_id: Any) -> TopicInfo | None: ...

INITIAL_EPOCH = 0
FINAL_EPOCH = -1


class FetchSession:
    def __init__(self, session_id: int) -> None:
        self.id = session_id
        self.epoch = 1
        # (topic name or topic id, partition) -> [topic, topic_id, FetchPartition, last (hw, lso, lso)]
        self.partitions: dict[tuple, list] = {}
        self.full_next = True

    def apply(self, request: FetchRequest, version: int, broker: TopicIds) -> None:
        for t in request.topics:
            topic, topic_id = _names(t, version, broker)
            for fp in t.partitions:
                key = (topic_id if version >= 13 else topic, fp.partition)
                entry = self.partitions.get(key)
                if entry is None:
                    self.partitions[key] = [topic, topic_id, fp, None]
                else:
                    entry[2] = fp
        if version >= 7:
            for f in request.forgotten_topics_data:
                ident = f.topic_id if version >= 13 else f.topic
                for p in f.partitions:
                    self.partitions.pop((ident, p), None)

    def wanted(self, request: FetchRequest, version: int, broker: TopicIds) -> Wanted:
        grouped: dict[tuple[str | None, uuid.UUID | None], list[Any]] = {}
        for topic, topic_id, fp, _ in self.partitions.values():
            grouped.setdefault((topic, topic_id), []).append(fp)
        return [(t, tid, fps) for (t, tid), fps in grouped.items()]

    def answered(self, ident: Any, partition: int) -> tuple[int, int, int] | None:
        """(high watermark, last stable offset, log start offset) the session's last answer carried
        for the partition; None when the next answer carries every partition anyway (the first)."""
        if self.full_next:
            return None
        entry = self.partitions.get((ident, partition))
        return entry[3] if entry is not None else None

    def filter_response(self, responses: list[FetchableTopicResponse], version: int) -> list[FetchableTopicResponse]:
        """Keep what an incremental response must carry (all of it for the session's first one)."""
        full = self.full_next
        self.full_next = False
        out = []
        for topic_resp in responses:
            ident = topic_resp.topic_id if version >= 13 else topic_resp.topic
            keep = []
            for pd in topic_resp.partitions:
                entry = self.partitions.get((ident, pd.partition_index))
                state = (pd.high_watermark, pd.last_stable_offset, pd.log_start_offset)
                records = pd.records
                has_records = records is not None and (records.size if hasattr(records, "size") else len(records))
                if full or has_records or pd.error_code or entry is None or entry[3] != state:
                    keep.append(pd)
                if entry is not None:
                    entry[3] = state
            if keep:
                topic_resp.partitions = keep
                out.append(topic_resp)
        return out


def _names(t: Any, version: int, broker: TopicIds) -> tuple[str | None, uuid.UUID | None]:
    if version >= 13:
        info = broker.topic_by_id(t.topic_id)
        return (info.name if info else None), t.topic_id
    return t.topic, None


class FetchSessionCache:
    def __init__(self, max_sessions: int) -> None:
        self.max_sessions = max_sessions
        self.sessions: collections.OrderedDict[int, FetchSession] = collections.OrderedDict()
        self._ids = itertools.count(1)

    def update(self, request: FetchRequest, version: int, broker: TopicIds) -> tuple[FetchSession | None, ErrorCode]:
        """(session or None for a sessionless fetch, top-level error code)."""
        if version < 7:
            return None, ErrorCode.NONE
        sid, epoch = request.session_id, request.session_epoch
        if epoch == FINAL_EPOCH:
            if sid:
                self.sessions.pop(sid, None)
            return None, ErrorCode.NONE
        if epoch == INITIAL_EPOCH:
            if sid:
                self.sessions.pop(sid, None)
            if self.max_sessions <= 0:
                return None, ErrorCode.NONE
            while len(self.sessions) >= self.max_sessions:
                self.sessions.popitem(last=False)
            session = FetchSession(next(self._ids) & 0x7FFFFFFF or next(self._ids))
            session.apply(request, version, broker)
            self.sessions[session.id] = session
            return session, ErrorCode.NONE
        found = self.sessions.get(sid)
        if found is None:
            return None, ErrorCode.FETCH_SESSION_ID_NOT_FOUND
        session = found
        if epoch != session.epoch:
            return None, ErrorCode.INVALID_FETCH_SESSION_EPOCH
        session.epoch += 1
        self.sessions.move_to_end(sid)
        session.apply(request, version, broker)
        return session, ErrorCode.NONE
