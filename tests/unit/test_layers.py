"""The layer contracts of DESIGN ("Layers") hold: import-linter over the whole package."""

import shutil
import subprocess
from pathlib import Path


def test_import_layers():
    exe = shutil.which("lint-imports")
    assert exe, "import-linter is not installed: run the README's test command"
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([exe, "--no-cache"], cwd=root, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
