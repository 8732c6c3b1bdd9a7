"""mypy over the broker's packages (server/, cluster/, coordinator/), with the configuration in
pyproject.toml ([tool.mypy]): every function annotated and every module clean, but for the modules the
configuration names with the reason."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_broker_packages_type_check():
    done = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
