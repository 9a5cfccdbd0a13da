"""Registering your own groupers, tasks, rewards, advantage estimators, objectives and
exchanges, and plugins.

Each kind lives in one dict in its own module (``grouping.GROUPERS``, ``tasks.TASKS``,
``rewards.REWARDS``, ``advantages.ADVANTAGES``) and has a ``register_*`` function there; this
module holds what they share: the rule for names (re-running a notebook cell that defines
the same function again replaces it; a different function under a taken name is an error
naming both) and ``load_plugins``, which imports the modules a config names
(``TrainConfig.plugins``, ``grpo-lab train --plugin mod``) so their registrations exist
before the config is checked, in every process of a run.

Plugins are known by their file's resolved path and the sha256 of its bytes:
  * loading a file again whose bytes changed re-executes it in the same module, after
    removing what it had registered (so a renamed or deleted registration goes too), and
    warns ``PluginReloaded``; an unchanged file is not executed again;
  * two files with the same name in different folders are two plugins (the module name
    carries a hash of the folder);
  * a module loaded by name and then by its path (or the other way round) is one plugin;
  * ``plugin_digests`` gives {path: sha256}: the trainer keeps it in the run's first
    metrics row (``plugins/sha256``), and ``plugin_changes`` refuses a resume whose plugin
    code differs unless overridden. Only the plugin file itself is hashed, not modules it
    imports.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import math
import numbers
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path

from grpo_lab.errors import one_line
from grpo_lab.paths import file_sha256

_REGISTRIES: dict[int, tuple] = {}   # id -> (registry dict, current): every registry seen
_BY_PATH: dict[Path, tuple] = {}     # resolved plugin file -> (module, sha256 of its bytes)


class PluginReloaded(UserWarning):
    """A plugin file changed since it was loaded and was executed again."""


def ident(fn) -> str:
    """'module.qualname' of a function: what makes two definitions 'the same function'."""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def lookup(registry, name, kind: str, hint: str = ""):
    """``registry[name]`` (a mapping), or ``name`` itself when ``registry`` is a set, tuple or
    list of names holding it; otherwise a ``ValueError`` naming the unknown value and every
    known one: the one "unknown X 'name'; known: [...]" message of the package."""
    try:
        if isinstance(registry, Mapping):
            return registry[name]
        if name in registry:
            return name
    except (KeyError, TypeError):                 # absent, or unhashable
        pass
    raise ValueError(f"unknown {kind} {name!r}; known: {sorted(registry, key=str)}"
                     + (f" ({hint})" if hint else ""))


def check_new(registry: dict, kind: str, name, fn, current=lambda v: v) -> None:
    """Raise unless ``name`` is a usable key for ``fn`` in ``registry``."""
    _REGISTRIES[id(registry)] = (registry, current)
    if not isinstance(name, str) or not name or "," in name:
        raise ValueError(f"a {kind} needs a non-empty name without commas, got {name!r}")
    if not callable(fn):
        raise ValueError(f"{kind} {name!r}: {fn!r} is not callable")
    if name in registry and ident(current(registry[name])) != ident(fn):
        raise ValueError(f"{kind} {name!r} is already registered ({ident(current(registry[name]))}); "
                         f"pick another name for {ident(fn)}")


SETTINGS: dict[str, type] = {}
"""Settings blocks: name -> the dataclass a record declares for its settings (variants.py's
``TIS``, ``KL``, loss.py's ``Clip``, an exchange kind's ``Compression``, a plugin's own). ``TrainConfig`` holds one of each
(``cfg.tis.cap``, ``--tis.cap 2``, ``{"tis": {"cap": 2}}``); each checks itself with its
``check(cfg)`` method, if it has one."""


CONFIG_FIELDS: set[str] = set()
"""TrainConfig's own field names (config.py fills it): a block under one of them would take
``--steps`` from the field and make every later TrainConfig fail, naming no plugin."""


def register_settings(name: str, cls: type) -> type:
    """Add the settings block ``name`` (a dataclass whose every field has a default) -> cls.
    The naming rule of ``check_new``: registering the same class again (a re-run cell, a
    reloaded plugin) replaces it."""
    if name in CONFIG_FIELDS:
        raise ValueError(f"settings block {name!r} of {cls.__module__}.{cls.__qualname__}: "
                         f"{name!r} is a field of TrainConfig; pick another name")
    check_new(SETTINGS, "settings block", name, cls)
    if not isinstance(cls, type) or not dataclasses.is_dataclass(cls):
        raise ValueError(f"settings block {name!r}: {cls!r} is not a dataclass")
    bare = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING]
    if bare:
        raise ValueError(f"settings block {name!r}: every field needs a default (off), "
                         f"{bare} have none")
    SETTINGS[name] = cls
    return cls


KINDS = {
    "bool": (lambda v: isinstance(v, bool), "True or False"),
    "int": (lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool),
            "a whole number"),
    "float": (lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool), "a number"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "dict": (lambda v: isinstance(v, Mapping), "a mapping (a dict)"),
}
"""A field's annotation -> (does a value fit it, what it takes), for ``check_types``."""
FLOAT32_MAX = 3.4028234663852886e38


def check_types(record, prefix: str = "") -> None:
    """Raise ValueError naming the first field of the dataclass ``record`` whose value is not
    of its annotated kind (KINDS; ``X | None`` also takes None): "no" for a bool, 2.5 for an
    int, 5 for a string, a list for a dict; or a finite float beyond float32's range (1e300:
    the tensors it meets are float32). inf and nan are left to each field's own check. A
    numpy scalar (a sweep's np.float64, np.int64) becomes its Python number first, so the
    record stays plain data (json writes it)."""
    for f in dataclasses.fields(record):
        kinds = [k.strip() for k in getattr(f.type, "__name__", str(f.type)).split("|")]
        kind = [k for k in kinds if k != "None"]
        v = getattr(record, f.name)
        if type(v).__module__ == "numpy" and getattr(v, "shape", None) == ():
            v = v.item()
            object.__setattr__(record, f.name, v)            # a frozen record too
        if len(kind) != 1 or kind[0] not in KINDS or (v is None and "None" in kinds):
            continue
        fits, what = KINDS[kind[0]]
        if not fits(v):
            raise ValueError(f"{prefix}{f.name} must be {what}, got {v!r} ({type(v).__name__})")
        if kind[0] == "float" and math.isfinite(v) and abs(v) > FLOAT32_MAX:
            raise ValueError(f"{prefix}{f.name}={v!r} is beyond float32's range (about 3.4e38): "
                             f"the tensors it meets are float32")


def check_number(name: str, value, ok=lambda x: x >= 0, what: str = "finite and >= 0"):
    """Raise ValueError naming ``name`` unless ``value`` is a finite real number (not a bool)
    for which ``ok`` holds -> value."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or not ok(value):
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return value


def fields_finite(cfg, *names):
    """Raise ValueError naming the first of ``cfg``'s fields ``names`` that is not a finite real
    number (a bool is not one)."""
    for n in names:
        check_number(f"{type(cfg).__name__}.{n}", getattr(cfg, n), lambda v: True,
                     "a finite number")


def fields_positive(cfg, *names):
    for n in names:
        if not getattr(cfg, n) > 0:
            raise ValueError(f"{type(cfg).__name__}.{n} must be > 0, got {getattr(cfg, n)!r}")


def fields_nonnegative(cfg, *names):
    for n in names:
        if not getattr(cfg, n) >= 0:
            raise ValueError(f"{type(cfg).__name__}.{n} must be >= 0, got {getattr(cfg, n)!r}")


def _forget(module_name: str) -> list:
    """Remove every registration made by ``module_name`` -> [(registry, key, value)]."""
    gone = []
    for registry, current in _REGISTRIES.values():
        for key, value in list(registry.items()):
            if getattr(current(value), "__module__", None) == module_name:
                gone.append((registry, key, registry.pop(key)))
    return gone


def _execute(module, path: Path) -> None:
    """Run ``path``'s code in ``module``; on an error, put back what it had registered."""
    gone = _forget(module.__name__)
    try:
        importlib.util.spec_from_file_location(module.__name__, path).loader.exec_module(module)
    except BaseException:
        _forget(module.__name__)
        for registry, key, value in gone:
            registry[key] = value
        raise


def _load_file(path: Path, name: str | None = None):
    """The plugin at ``path``, executed once per content; ``name``: import it under this name
    (a module name given in ``plugins``) instead of a name made from the path."""
    if path.is_dir():                   # "no such file" would deny what the user can see
        raise IsADirectoryError(f"{path} is a folder: name the plugin's .py file")
    if not path.is_file():
        raise FileNotFoundError(f"no such file {path}")
    sha = file_sha256(path)
    if path in _BY_PATH:
        module, old = _BY_PATH[path]
        if old != sha:
            _execute(module, path)
            warnings.warn(f"plugin {path} changed since it was loaded (sha256 {old[:12]} -> "
                          f"{sha[:12]}): executed again, its registrations replaced",
                          PluginReloaded, stacklevel=3)
        if name is not None:
            sys.modules.setdefault(name, module)
    else:
        folder = hashlib.sha256(str(path.parent).encode()).hexdigest()[:8]
        name = name or f"grpo_lab_plugin_{path.stem}_{folder}"
        module = sys.modules.get(name)
        if module is None or Path(getattr(module, "__file__", "") or "").resolve() != path:
            module = importlib.util.module_from_spec(
                importlib.util.spec_from_file_location(name, path))
            sys.modules[name] = module
            try:
                _execute(module, path)
            except BaseException:
                del sys.modules[name]
                raise
    _BY_PATH[path] = (module, sha)
    return module


def load_plugins(plugins: str) -> list:
    """Import each module of ``plugins`` (comma-separated module names or .py paths) ->
    the modules, executing a file again only when its content changed (module docstring).
    A clear error names a plugin that cannot be imported: a ValueError, whatever its code
    raised (with the file and line of the plugin's that raised it)."""
    out = []
    for spec in [p.strip() for p in (plugins or "").split(",") if p.strip()]:
        try:
            if spec.endswith(".py") or "/" in spec:
                out.append(_load_file(Path(spec).resolve()))
                continue
            found = sys.modules.get(spec)
            origin = getattr(found, "__file__", None) if found else None
            if origin is None:
                found = importlib.util.find_spec(spec)
                if found is None:
                    raise ImportError(f"No module named {spec!r}")
                origin = found.origin if found.has_location else None
            if origin is None:                     # a built-in or namespace module
                out.append(importlib.import_module(spec))
            else:
                out.append(_load_file(Path(origin).resolve(), name=spec))
        except (ImportError, FileNotFoundError, IsADirectoryError, SyntaxError) as e:
            raise ValueError(f"plugin {spec!r} could not be imported: {type(e).__name__}: {e}") \
                from None
        except Exception as e:       # its own code raised: a ValueError too, naming the plugin
            # and its line (the CLI reports a ValueError in one line, any other type escaped
            # as a bare traceback); chained, so --debug still shows where
            raise ValueError(f"plugin {spec!r} could not be imported: {one_line(e)}") from e
    return out


def plugin_digests(plugins: str) -> dict[str, str]:
    """{resolved file path: sha256} of the plugins ``plugins`` names, as loaded now."""
    return {str(path): sha for module in load_plugins(plugins)
            for path, (m, sha) in _BY_PATH.items() if m is module}


def plugin_changes(where, history: list, now: dict, allow_override: bool) -> dict:
    """Compare a saved run's plugin digests (its first metrics row) with ``now`` -> {} or
    {"plugins/sha256": [saved, now]}; an error when they differ, unless ``allow_override``."""
    saved = (history[0].get("plugins/sha256") if history else None) or {}
    if saved == now:
        return {}
    if not allow_override:
        diff = [f"{p}: saved {saved.get(p, 'none')[:12]}, now {now.get(p, 'none')[:12]}"
                for p in sorted(set(saved) | set(now)) if saved.get(p) != now.get(p)]
        raise ValueError(f"cannot resume {where}: its plugin code differs from the code the "
                         f"run used ({'; '.join(diff)}); resume with the run's plugin files, or "
                         f"pass --override (allow_override=True) to go on with the new code "
                         f"(recorded in metrics.jsonl as resume/overrides)")
    return {"plugins/sha256": [saved, now]}
