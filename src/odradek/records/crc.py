"""CRC-32C (Castagnoli), the checksum of a record batch (seed 001, "Record batches"; Kafka's
`Crc32C`), from the `crc32c` package's compiled module without running the package's `__init__`.

That `__init__` asks `importlib.metadata` for its own version, which imports the metadata machinery
and scans every distribution on `sys.path`: 40-130 ms of every command's start-up for one string
nobody reads (issue 34), against about 1 ms for the extension alone. The extension is registered
under its own name, so a later `import crc32c` finds it and the two share one module. Should the
package's layout ever differ, the ordinary import is the fallback: slower, never wrong.
"""

from __future__ import annotations

import sys
from typing import Callable


def _load() -> Callable[..., int]:
    name = "crc32c._crc32c"
    module = sys.modules.get(name)
    if module is None:
        try:
            import importlib.machinery
            import importlib.util
            import os

            package = importlib.util.find_spec("crc32c")     # finds the package, does not run it
            where = list(package.submodule_search_locations or ()) if package else []
            for suffix in importlib.machinery.EXTENSION_SUFFIXES:
                path = os.path.join(where[0], "_crc32c" + suffix) if where else ""
                if path and os.path.exists(path):
                    spec = importlib.util.spec_from_file_location(name, path)
                    assert spec is not None and spec.loader is not None
                    module = importlib.util.module_from_spec(spec)
                    spec.loader.exec_module(module)
                    sys.modules[name] = module
                    break
        except (ImportError, OSError, AssertionError):
            module = None
    if module is None:
        from crc32c import crc32c as fallback
        return fallback
    return module.crc32c


crc32c = _load()
