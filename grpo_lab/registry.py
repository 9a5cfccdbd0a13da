"""Registering your own groupers, tasks, rewards, advantage estimators, objectives and
exchanges, and plugins.

Each kind lives in one dict in its own module (``grouping.GROUPERS``, ``tasks.TASKS``,
``rewards.REWARDS``, ``advantages.ADVANTAGES``) and has a ``register_*`` function there; this
module holds what they share: the rule for names (re-running a notebook cell that defines
the same function again replaces it; a different function under a taken name is an error
naming both) and ``load_plugins``, which imports the modules a config names
(``TrainConfig.plugins``, ``grpo-lab train --plugin mod``) so their registrations exist
before the config is checked, in every process of a run.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path


def ident(fn) -> str:
    """'module.qualname' of a function: what makes two definitions 'the same function'."""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def lookup(registry, name, kind: str, hint: str = ""):
    """``registry[name]``, or a ``ValueError`` naming the unknown value and every known one:
    the one "unknown X 'name'; known: [...]" message of the package."""
    try:
        return registry[name]
    except (KeyError, TypeError):
        pass
    raise ValueError(f"unknown {kind} {name!r}; known: {sorted(registry)}"
                     + (f" ({hint})" if hint else ""))


def check_new(registry: dict, kind: str, name, fn, current=lambda v: v) -> None:
    """Raise unless ``name`` is a usable key for ``fn`` in ``registry``."""
    if not isinstance(name, str) or not name or "," in name:
        raise ValueError(f"a {kind} needs a non-empty name without commas, got {name!r}")
    if not callable(fn):
        raise ValueError(f"{kind} {name!r}: {fn!r} is not callable")
    if name in registry and ident(current(registry[name])) != ident(fn):
        raise ValueError(f"{kind} {name!r} is already registered ({ident(current(registry[name]))}); "
                         f"pick another name for {ident(fn)}")


def load_plugins(plugins: str) -> list:
    """Import each module of ``plugins`` (comma-separated module names or .py paths) once ->
    the modules. A clear error names a plugin that cannot be imported."""
    out = []
    for spec in [p.strip() for p in (plugins or "").split(",") if p.strip()]:
        try:
            if spec.endswith(".py") or "/" in spec:
                path = Path(spec).resolve()
                name = f"grpo_lab_plugin_{path.stem}"
                if name not in sys.modules:
                    if not path.is_file():
                        raise FileNotFoundError(f"no such file {path}")
                    loader = importlib.util.spec_from_file_location(name, path)
                    module = importlib.util.module_from_spec(loader)
                    sys.modules[name] = module
                    try:
                        loader.loader.exec_module(module)
                    except BaseException:
                        del sys.modules[name]
                        raise
                out.append(sys.modules[name])
            else:
                out.append(importlib.import_module(spec))
        except (ImportError, FileNotFoundError, SyntaxError) as e:
            raise ValueError(f"plugin {spec!r} could not be imported: {type(e).__name__}: {e}") \
                from None
    return out
