"""The project's scripts (bench/, tools/, docs/) loaded as modules by their path, for the tests
of their bookkeeping: they are not a package. ``sys.path`` is given back as it was (a script
may put bench/ or the checkout on it)."""
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_script(relpath: str, name: str | None = None):
    """ROOT/relpath run as the module ``name`` (default: the file's stem) -> the module."""
    path = ROOT / relpath
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    module = importlib.util.module_from_spec(spec)
    before = list(sys.path)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = before
    return module
