"""Settings for the whole suite, before any test module is imported.

Compiled modules for the processes the tests start. The suite starts hundreds of Python processes: brokers
(`odradek serve`), command-line tools, Spark's Python workers, client scripts. Where the environment sets
`PYTHONDONTWRITEBYTECODE`, each of them compiled every module it imported from source again, about a second
per broker start, which an installed package never pays. The processes the tests start share one bytecode
cache instead (`PYTHONPYCACHEPREFIX`, outside the tree, so the checkout stays clean): the first process to
import a module writes its compiled form and the others read it. Python checks each cached file against
its source's modification time and size, so an edited module is compiled again; writes are atomic (a
temporary file renamed), so processes starting together are safe. Nothing a test observes changes but the
time to start.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def pytest_configure(config) -> None:
    if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is None:
        return              # bytecode is written as usual, next to the sources
    cache = Path(tempfile.gettempdir()) / f"odradek-tests-pycache-{os.getuid()}"
    cache.mkdir(mode=0o700, exist_ok=True)
    os.environ.setdefault("PYTHONPYCACHEPREFIX", str(cache))
