"""Pure parts of the group and perf tools: lag rows, reset plans, topic specs, percentiles, pacing,
config-list parsing and the argument errors."""

from __future__ import annotations

import argparse

import pytest

from odradek.cli.common import CliError, parse_key_values, read_properties
from odradek.cli.configs import parse_config_list
from odradek.cli.groups import lag_rows, parse_topic_spec, plan_reset
from odradek.cli.main import main
from odradek.cli.perf import pace, percentile, produce_summary
from odradek.client.admin_types import MemberDescription, OffsetAndMetadata
from odradek.client.fetcher import OffsetAndTimestamp, TopicPartition as TP


def test_topic_specs():
    assert parse_topic_spec("events") == ("events", None)
    assert parse_topic_spec("events:2,0,2") == ("events", [0, 2])
    for bad in ("events:", "events:x", ":1", "events:-1"):
        with pytest.raises(CliError):
            parse_topic_spec(bad)


def test_lag_rows_cover_committed_and_assigned_partitions():
    m = MemberDescription("m-1", None, "cli", "/10.0.0.1", [TP("t", 1), TP("t", 2)])
    rows = lag_rows({TP("t", 0): OffsetAndMetadata(5), TP("t", 1): OffsetAndMetadata(7)},
                    {TP("t", 0): 9, TP("t", 1): 7, TP("t", 2): 3}, [m])
    assert [(r["partition"], r["current_offset"], r["log_end_offset"], r["lag"], r["consumer_id"]) for r in rows] == [
        (0, 5, 9, 4, None), (1, 7, 7, 0, "m-1"), (2, None, 3, None, "m-1")]


def reset_args(**kw):
    base = dict(to_earliest=False, to_latest=False, to_current=False, to_offset=None, shift_by=None, to_datetime=None)
    base.update(kw)
    return argparse.Namespace(**base)


TPS = [TP("t", 0), TP("t", 1)]
LOW = {TP("t", 0): 10, TP("t", 1): 0}
HIGH = {TP("t", 0): 100, TP("t", 1): 50}


def test_reset_plans_are_clamped_to_the_log():
    committed = {TP("t", 0): 20}
    assert plan_reset(reset_args(to_earliest=True), TPS, committed, LOW, HIGH, {}) == {TP("t", 0): 10, TP("t", 1): 0}
    assert plan_reset(reset_args(to_latest=True), TPS, committed, LOW, HIGH, {}) == {TP("t", 0): 100, TP("t", 1): 50}
    assert plan_reset(reset_args(to_offset=60), TPS, committed, LOW, HIGH, {}) == {TP("t", 0): 60, TP("t", 1): 50}
    assert plan_reset(reset_args(to_offset=3), TPS, committed, LOW, HIGH, {}) == {TP("t", 0): 10, TP("t", 1): 3}
    assert plan_reset(reset_args(shift_by=-15), TPS[:1], committed, LOW, HIGH, {}) == {TP("t", 0): 10}
    assert plan_reset(reset_args(shift_by=5), TPS[:1], committed, LOW, HIGH, {}) == {TP("t", 0): 25}
    with pytest.raises(CliError, match="no committed offset for t-1"):
        plan_reset(reset_args(shift_by=1), TPS, committed, LOW, HIGH, {})


def test_reset_to_datetime_goes_to_the_end_past_the_last_record():
    by_time = {TP("t", 0): OffsetAndTimestamp(42, 1), TP("t", 1): OffsetAndTimestamp(-1, -1)}
    assert plan_reset(reset_args(to_datetime="x"), TPS, {}, LOW, HIGH, by_time) == {TP("t", 0): 42, TP("t", 1): 50}


def test_percentiles_and_summary():
    values = sorted(float(i) for i in range(1, 1001))
    assert percentile(values, 0.5) == 501.0
    assert percentile(values, 0.999) == 1000.0
    assert percentile([], 0.5) == 0.0
    s = produce_summary(1000, 1024, 2.0, list(reversed(values)))
    assert s["records_per_s"] == 500.0 and s["mb_per_s"] == round(1000 * 1024 / 2 / 1024 / 1024, 2)
    assert (s["latency_max_ms"], s["latency_p50_ms"], s["latency_avg_ms"]) == (1000.0, 501.0, 500.5)


def test_pacing():
    assert pace(0, -1, 0.0) == 0.0
    assert pace(100, 100.0, 0.5) == pytest.approx(0.5)
    assert pace(10, 100.0, 1.0) == 0.0


def test_config_lists_and_key_values(tmp_path):
    assert parse_config_list(["a=1,b=[x,y],c=", "d=e=f"]) == {"a": "1", "b": "x,y", "c": "", "d": "e=f"}
    with pytest.raises(CliError):
        parse_config_list(["novalue"])
    assert parse_key_values(["a=b=c"]) == {"a": "b=c"}
    with pytest.raises(CliError):
        parse_key_values(["=x"])
    f = tmp_path / "client.properties"
    f.write_text("# comment\nclient.id = me\n! other\nrequest.timeout.ms: 5000\n\n")
    assert read_properties(str(f)) == {"client.id": "me", "request.timeout.ms": "5000"}
    with pytest.raises(CliError, match="cannot read"):
        read_properties(str(tmp_path / "missing"))


@pytest.mark.parametrize("argv, needle", [
    (["topics", "create"], "the following arguments are required: --topic"),
    (["topics", "create", "--topic", "t", "--partitions", "0"], "must be positive"),
    (["consume", "--topic", "t", "--max-messages", "x"], "not an integer"),
    (["groups", "reset-offsets", "--group", "g", "--topic", "t"], "one of the arguments"),
    (["configs", "describe", "--entity-type", "users"], "invalid choice"),
])
def test_bad_arguments_are_one_line_and_status_2(capsys, argv, needle):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1, err


@pytest.mark.parametrize("argv, needle", [
    (["consume", "--topic", "t", "--offset", "5"], "--offset needs --partition"),
    (["consume", "--topic", "t", "--group", "g", "--partition", "0"], "--group cannot be combined"),
    (["consume", "--topic", "t", "--property", "print.nothing=true", "--partition", "0", "--offset", "1"],
     "unknown --property print.nothing"),
    (["produce", "--topic", "t", "--property", "parse.key=maybe"], "must be true or false"),
])
def test_argument_checks_before_any_connection(capsys, argv, needle):
    # localhost:1 is never reached: these fail while checking the arguments.
    assert main([*argv, "--bootstrap-server", "127.0.0.1:1", "--timeout", "0.5"]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1, err
