"""The console tools' text formats: Kafka's LineMessageReader and DefaultMessageFormatter rules."""

from __future__ import annotations

import datetime as dt

import pytest

from odradek.cli.formats import FormatError, LineReader, RecordFormatter, parse_timestamp, record_json
from odradek.client.fetcher import ConsumerRecord


def reader(**props) -> LineReader:
    return LineReader.from_properties({k.replace("_", "."): v for k, v in props.items()})


def test_plain_lines_are_values_with_no_key():
    assert reader().parse(b"hello\tworld", 1) == (None, b"hello\tworld", [])


def test_parse_key_splits_at_the_first_separator():
    r = reader(parse_key="true", key_separator=":")
    assert r.parse(b"k:v:w", 1) == (b"k", b"v:w", [])
    assert r.parse(b":v", 1) == (b"", b"v", [])


def test_default_key_separator_is_a_tab_and_escapes_are_understood():
    assert reader(parse_key="true").parse(b"k\tv", 1) == (b"k", b"v", [])
    assert reader(parse_key="true", key_separator="\\t").parse(b"k\tv", 1) == (b"k", b"v", [])


def test_missing_key_separator_is_an_error_unless_ignored():
    with pytest.raises(FormatError, match="no key separator ':' on line 7"):
        reader(parse_key="true", key_separator=":").parse(b"nokey", 7)
    assert reader(parse_key="true", key_separator=":", ignore_error="true").parse(b"nokey", 7) == (None, b"nokey", [])


def test_headers_then_key_then_value():
    r = reader(parse_key="true", parse_headers="true")
    key, value, headers = r.parse(b"a:1,b:,c:x:y\tk\tv", 1)
    assert (key, value) == (b"k", b"v")
    assert headers == [("a", b"1"), ("b", b""), ("c", b"x:y")]


def test_custom_header_separators_and_repeated_keys():
    r = reader(parse_headers="true", headers_delimiter="|", headers_separator=";", headers_key_separator="=")
    assert r.parse(b"a=1;a=2|value", 1) == (None, b"value", [("a", b"1"), ("a", b"2")])


def test_header_without_key_separator():
    with pytest.raises(FormatError, match="no header key separator"):
        reader(parse_headers="true").parse(b"h\tv", 3)
    assert reader(parse_headers="true", ignore_error="true").parse(b"h\tv", 3) == (None, b"v", [("h", None)])


def test_missing_headers_delimiter():
    with pytest.raises(FormatError, match="no headers delimiter"):
        reader(parse_headers="true").parse(b"value", 2)


def test_null_marker_makes_keys_values_and_header_values_null():
    r = reader(parse_key="true", parse_headers="true", null_marker="NULL")
    assert r.parse(b"h:NULL\tNULL\tNULL", 1) == (None, None, [("h", None)])
    with pytest.raises(FormatError, match="header keys cannot be null"):
        r.parse(b"NULL:x\tk\tv", 1)


def test_unknown_or_bad_properties():
    with pytest.raises(FormatError, match="unknown --property parse.value"):
        reader(parse_value="true")
    with pytest.raises(FormatError, match="true or false"):
        reader(parse_key="yes")
    with pytest.raises(FormatError, match="must not be empty"):
        reader(key_separator="")


def rec(**kw) -> ConsumerRecord:
    base = dict(topic="t", partition=2, offset=5, timestamp=1700000000123, timestamp_type=0, key=b"k",
                value=b"v", headers=[("h1", b"x"), ("h2", None)])
    base.update(kw)
    return ConsumerRecord(**base)


def fmt(**props) -> RecordFormatter:
    return RecordFormatter.from_properties({k.replace("_", "."): v for k, v in props.items()})


def test_default_output_is_the_value_and_a_newline():
    assert fmt().format(rec()) == b"v\n"
    assert fmt().format(rec(value=None)) == b"null\n"


def test_every_field_in_kafkas_order():
    f = fmt(print_timestamp="true", print_partition="true", print_offset="true", print_headers="true",
            print_key="true")
    assert f.format(rec()) == b"CreateTime:1700000000123\tPartition:2\tOffset:5\th1:x,h2:null\tk\tv\n"
    assert f.format(rec(headers=[], timestamp_type=1)) == b"LogAppendTime:1700000000123\tPartition:2\tOffset:5\tNO_HEADERS\tk\tv\n"


def test_separators_null_literal_and_no_value():
    f = fmt(print_key="true", print_value="false", key_separator=" | ", line_separator="\\r\\n", null_literal="<nil>")
    assert f.format(rec(key=None)) == b"<nil>\r\n"
    f = fmt(print_key="true", key_separator="=", null_literal="-")
    assert f.format(rec(key=None, value=None)) == b"-=-\n"


def test_json_record_with_binary_and_null():
    j = record_json(rec(key=None, value=b"\xff\x00", headers=[("a", b"1")]))
    assert j == {"topic": "t", "partition": 2, "offset": 5, "timestamp": 1700000000123, "timestamp_type": "CreateTime",
                 "key": None, "value": {"base64": "/wA="}, "headers": [["a", "1"]]}


def test_timestamps_in_ms_and_iso():
    assert parse_timestamp("1700000000123") == 1700000000123
    assert parse_timestamp("2024-05-01T12:00:00Z") == 1714564800000
    assert parse_timestamp("2024-05-01T12:00:00.250+02:00") == 1714557600250
    local = dt.datetime(2024, 5, 1, 12, 0).astimezone()
    assert parse_timestamp("2024-05-01T12:00:00") == int(local.timestamp() * 1000)
    with pytest.raises(FormatError, match="ISO 8601"):
        parse_timestamp("yesterday")
