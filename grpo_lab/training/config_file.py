"""``--config FILE``: a run's config fields in a JSON or YAML file, read as their flags.

The file holds the same names as the flags of ``grpo-lab train``: a sub-config as a nested
mapping (``{"exchange": {"name": "sharded"}}``, what ``out_dir/config.json`` holds) or by
its flag's dotted name (``"exchange.name": "sharded"``), and optionally a ``preset``. Each key becomes the flag
``--key=value`` (``config_file_args``) and goes through the train command's own parser
(cli.read_config_file), so an unknown key, a wrong type or a bad value gets the error the
flag gets, with the file named in front. JSON's null is None, for the fields whose default
is None (``exchange.momentum``); a flag cannot say None.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from grpo_lab.training.config import TrainConfig, sub_configs


class ConfigFileError(ValueError):
    """A key or value of a --config file that its flag would refuse (the flag's message)."""


def flag_text(value, key: str, path) -> str:
    """A config file's value -> the text its flag would be given (JSON's true -> "true",
    a reward_weights mapping -> "accuracy=1.0,format=0.1", floats exactly: repr)."""
    if value is None:
        raise ConfigFileError(f"--config {path}: {key}: null is no value here")
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return ",".join(f"{k}={flag_text(v, f'{key}.{k}', path)}" for k, v in value.items())
    return repr(value) if isinstance(value, float) else str(value)


def config_file_args(path: str | Path) -> tuple[list[str], list[str]]:
    """A JSON or YAML config file -> (the flags it stands for: ["--steps=30",
    "--exchange.name=sharded", ...], the dotted keys set to null): a sub-config's mapping
    becomes its dotted flags."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigFileError(f"--config {path}: cannot read it ({e.strerror})") from None
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ConfigFileError(f"--config {path}: YAML needs PyYAML (pip install pyyaml); "
                                  f"or write the file as JSON") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigFileError(f"--config {path}: not valid YAML: {e}") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigFileError(f"--config {path}: not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ConfigFileError(f"--config {path}: expected a mapping of field names to values, "
                              f"got {type(data).__name__}")
    flat = {}
    for key, value in data.items():
        if key in sub_configs() and isinstance(value, dict):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[str(key)] = value
    return ([f"--{k}={flag_text(v, k, path)}" for k, v in flat.items() if v is not None],
            [k for k, v in flat.items() if v is None])


def nullable(key: str) -> bool:
    """True for a dotted field name whose default is None (``exchange.momentum``: a
    ``float | None`` field); a flag cannot say None, a config file can (null)."""
    sub, _, name = key.rpartition(".")
    if sub and sub not in sub_configs():
        return False
    cls = type(getattr(TrainConfig(), sub)) if sub else TrainConfig
    f = next((f for f in dataclasses.fields(cls) if f.name == name), None)
    return f is not None and f.default is None
