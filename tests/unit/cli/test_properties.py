"""The one properties reader (`odradek.properties`) that `serve --config` and every tool's
`--command-config` share, held to java.util.Properties.load's rules; and the plain table format."""

from __future__ import annotations

import pytest

from odradek import properties
from odradek.cli.common import CliError, format_table, read_properties
from odradek.server import config as server_config

JAVA_SYNTAX = (
    "# comment\n"
    "! also a comment\n"
    "   \n"
    "a=1\n"
    "b : 2\n"
    "c 3\n"
    "d\t\t4\n"
    "long = first,\\\n"
    "       second,\\\n"
    "       third\n"
    "escaped\\ key\\=x = tab\\there\\u0021\n"
    "path=C:\\\\data\n"
    "empty=\n"
    "bare\n"
    "a=again\n"
)


def test_java_properties_rules(tmp_path):
    f = tmp_path / "x.properties"
    f.write_text(JAVA_SYNTAX)
    assert read_properties(str(f)) == {
        "a": "again", "b": "2", "c": "3", "d": "4", "long": "first,second,third",
        "escaped key=x": "tab\there!", "path": "C:\\data", "empty": "", "bare": "",
    }


def test_serve_and_tools_share_one_reader(tmp_path):
    f = tmp_path / "x.properties"
    f.write_text(JAVA_SYNTAX)
    assert server_config.load_properties is properties.load_properties
    assert server_config.parse_properties is properties.parse_properties
    assert read_properties(str(f)) == server_config.load_properties(f)


def test_unreadable_and_malformed_files_are_one_line_errors(tmp_path):
    with pytest.raises(CliError, match="cannot read"):
        read_properties(str(tmp_path / "missing"))
    bad = tmp_path / "bad.properties"
    bad.write_text("k=\\u12G4\n")
    with pytest.raises(CliError, match="bad.properties"):
        read_properties(str(bad))


def test_plain_table_has_no_blank_lines_or_trailing_spaces():
    text = format_table(["A", "LONGER", "C"], [("x", None, ""), ("yy", 3, "z")], title="Title: t  Configs: ")
    assert text == "Title: t  Configs:\nA   LONGER  C\nx   -\nyy  3       z\n"
