"""The error-code table against seed 003's table, and its own invariants."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from odradek.protocol import error_codes
from odradek.protocol.error_codes import (
    SEED_DEVIATIONS,
    ErrorCode,
    KafkaApiError,
    by_name,
    for_code,
    is_retriable,
    message,
)

SEED_TABLE = Path(__file__).parent / "data" / "seed_error_codes.txt"  # from seed 003's error table


def _seed_table() -> list[tuple[str, int, bool]]:
    rows = []
    for line in SEED_TABLE.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            name, code, retriable = line.split()
            rows.append((name, int(code), retriable == "True"))
    return rows


def test_seed_table_parses() -> None:
    rows = _seed_table()
    codes = [code for _, code, _ in rows]
    assert codes == list(range(-1, 82)), "seed table should list -1..81 in order"


@pytest.mark.parametrize("row", _seed_table(), ids=lambda row: row[0])
def test_every_seed_code_is_present(row: tuple[str, int, bool]) -> None:
    name, code, retriable = row
    expected_name, expected_retriable = SEED_DEVIATIONS.get(name, (name, retriable))
    member = ErrorCode(code)
    assert member.name == expected_name
    assert member.retriable is expected_retriable
    assert by_name(name) is member  # the seed's name resolves, even where Kafka renamed it


def test_deviations_are_real_deviations() -> None:
    seed = {name: (code, retriable) for name, code, retriable in _seed_table()}
    for seed_name, (name, retriable) in SEED_DEVIATIONS.items():
        code, seed_retriable = seed[seed_name]
        assert (seed_name, seed_retriable) != (name, retriable), seed_name
        assert ErrorCode[name] == code


def test_codes_are_unique_and_contiguous() -> None:
    codes = [int(member) for member in ErrorCode]
    assert len(codes) == len(set(codes))
    assert sorted(codes) == list(range(error_codes.MIN_CODE, error_codes.MAX_CODE + 1))
    assert len(ErrorCode.__members__) == len(codes), "no aliases inside the enum"


def test_names_are_kafka_style() -> None:
    for member in ErrorCode:
        assert re.fullmatch(r"[A-Z][A-Z0-9_]*", member.name)
        assert isinstance(member.retriable, bool)
        assert member.message or member is ErrorCode.NONE


def test_newest_codes_through_kafka_4_1() -> None:
    assert ErrorCode.INVALID_REGULAR_EXPRESSION == 128
    assert ErrorCode.REBOOTSTRAP_REQUIRED == 129
    assert ErrorCode.STREAMS_INVALID_TOPOLOGY == 130
    assert ErrorCode.STREAMS_INVALID_TOPOLOGY_EPOCH == 131
    assert ErrorCode.STREAMS_TOPOLOGY_FENCED == 132
    assert ErrorCode.SHARE_SESSION_LIMIT_REACHED == 133
    assert is_retriable(133) and not is_retriable(129)


def test_helpers() -> None:
    assert is_retriable(ErrorCode.NOT_LEADER_OR_FOLLOWER)
    assert not is_retriable(ErrorCode.INVALID_CONFIG)
    assert not is_retriable(9999)
    assert message(40) == ErrorCode.INVALID_CONFIG.message
    assert "9999" in message(9999)
    assert for_code(9999) is ErrorCode.UNKNOWN_SERVER_ERROR
    assert for_code(3) is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert by_name("invalid_config") is ErrorCode.INVALID_CONFIG
    assert by_name("GROUP_COORDINATOR_NOT_AVAILABLE") is ErrorCode.COORDINATOR_NOT_AVAILABLE
    with pytest.raises(KeyError):
        by_name("NO_SUCH_ERROR")


def test_api_error_carries_code() -> None:
    err = KafkaApiError(ErrorCode.INVALID_CONFIG, "bad retention.ms")
    assert err.code == 40 and err.detail == "bad retention.ms" and not err.retriable
    assert KafkaApiError(ErrorCode.REQUEST_TIMED_OUT).detail == ErrorCode.REQUEST_TIMED_OUT.message
