"""The committed generated code matches the schemas (CI fails on drift)."""

from odradek.protocol import generator


def test_generated_code_matches_schemas(capsys):
    assert generator.main(["--check"]) == 0, capsys.readouterr().err
