"""``--config FILE``: a run's config fields in a JSON or YAML file, read as their flags.

The file holds the same names as the flags of ``grpo-lab train``: a sub-config as a nested
mapping (``{"exchange": {"name": "sharded"}}``, what ``out_dir/config.json`` holds) or by
its flag's dotted name (``"exchange.name": "sharded"``), and optionally a ``preset``. Each key becomes the flag
``--key=value`` (``config_file_args``) and goes through the train command's own parser
(cli.read_config_file), so an unknown key, a wrong type or a bad value gets the error the
flag gets, with the file named in front. JSON's null is None, for the fields whose default
is None (``compression.momentum``); a flag cannot say None. A TRL GRPOConfig's key names are
read as the grpo_lab settings that mean the same (trl_keys.py).

A config file may come from anywhere (a download, a colleague), so it is read defensively,
and every refusal names the file:
- at most ``MAX_BYTES`` (256 KiB; a run's config.json is about 3 kB), checked before reading;
- UTF-8 text only: a binary file is named with the first byte that is not text;
- YAML's anchors and aliases are refused where the parser meets the first one, before
  anything is expanded (a 479-byte "billion laughs" file expands to 9**9 strings);
- a key written twice in one mapping, or one field given both nested and dotted
  (``exchange: {name: ...}`` and ``exchange.name:``), is refused with both lines: the
  reader does not pick one silently.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from grpo_lab.training.config import TrainConfig, sub_configs
from grpo_lab.training.trl_keys import translate

MAX_BYTES = 256 * 1024


class ConfigFileError(ValueError):
    """A key or value of a --config file that its flag would refuse (the flag's message)."""


def flag_text(value, key: str, path) -> str:
    """A config file's value -> the text its flag would be given (JSON's true -> "true",
    a reward_weights mapping -> "accuracy=1.0,format=0.1", floats exactly: repr)."""
    if value is None:
        raise ConfigFileError(f"--config {path}: {key}: null is no value here")
    if isinstance(value, bool):
        return str(value).lower()
    # a list or a mapping given to a field of one value would reach its flag as Python's text
    # ("['a']"), which a str field takes as it is (an out_dir named ['a']); an unknown key's
    # goes on to its flag's error
    field = field_of(key) if isinstance(value, (dict, list)) else None
    if field is not None:
        mapping = field.default is dataclasses.MISSING and isinstance(field.default_factory(),
                                                                       dict)
        if not (mapping and isinstance(value, dict)):
            takes = "a mapping of names to values" if mapping else "one value"
            raise ConfigFileError(f"--config {path}: {key}: a {type(value).__name__} "
                                  f"{json.dumps(value, default=str)[:80]} is no value here "
                                  f"(the field takes {takes})")
    if isinstance(value, dict):
        return ",".join(f"{k}={flag_text(v, f'{key}.{k}', path)}" for k, v in value.items())
    return repr(value) if isinstance(value, float) else str(value)


VERSION_KEY = "grpo_lab_version"
"""out_dir/config.json's record of the grpo_lab that wrote it (trainer.py); not a field: read
back, it is skipped."""
FAST_PATH_KEY = "fast_path_choice"
"""out_dir/config.json's record of the fast-path probe (speed_probe.py) when speed.fast_path="probe";
not a field: read back, it is skipped."""


def read_text(path: Path) -> str:
    """The file's text: at most MAX_BYTES, UTF-8, no NUL byte."""
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise ConfigFileError(f"--config {path}: {size:,} bytes, over the {MAX_BYTES:,}-byte "
                                  f"limit for a config file (a run's config.json is about 3 kB)")
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)[:MAX_BYTES]
    except OSError as e:
        raise ConfigFileError(f"--config {path}: cannot read it ({e.strerror})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigFileError(f"--config {path}: not a text file: byte 0x{data[e.start]:02x} "
                              f"at offset {e.start} is not UTF-8") from None
    if "\x00" in text:
        raise ConfigFileError(f"--config {path}: not a text file: a NUL byte at offset "
                              f"{data.index(0)}")
    return text


class _Refused(Exception):
    """A reader's refusal, before the file's name is put in front."""


def _given_twice(key: tuple, first: int, second: int) -> str:
    return (f"{'.'.join(map(str, key))} is given twice: line {first} and line {second}: "
            f"give it once")


def read_yaml(text: str) -> tuple[object, dict]:
    """YAML text -> (its data, {key path: line}), through PyYAML's safe loader: anchors and
    aliases are refused while the document is composed (at the first one), a key written
    twice in one mapping from the composed nodes; both before any value is built."""
    try:
        import yaml
    except ImportError:
        raise _Refused("YAML needs PyYAML (pip install pyyaml); or write the file as JSON")

    class Loader(yaml.SafeLoader):
        def compose_node(self, parent, index):
            event = self.peek_event()
            mark = "*" if isinstance(event, yaml.AliasEvent) else "&"
            if mark == "*" or getattr(event, "anchor", None) is not None:
                raise _Refused(f"line {event.start_mark.line + 1}: YAML anchors and aliases "
                               f"({mark}{event.anchor}) are not read in a config file: write "
                               f"each value out")
            return super().compose_node(parent, index)

    lines: dict[tuple, int] = {}

    def keys(node, at: tuple):
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                key = at + (str(k.value),)
                line = k.start_mark.line + 1
                if key in lines:
                    raise _Refused(_given_twice(key, lines[key], line))
                lines[key] = line
                keys(v, key)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                keys(item, at + (i,))

    loader = Loader(text)
    try:
        node = loader.get_single_node()
        keys(node, ())
        return (None if node is None else loader.construct_document(node)), lines
    except yaml.YAMLError as e:
        raise _Refused(f"not valid YAML: {yaml_error(e)}") from None
    finally:
        loader.dispose()


def yaml_error(e) -> str:
    """PyYAML's error in one line: its own message spans several, quoting the file's line with
    a caret under it, and the CLI's error is one line. "line 2, column 1: expected ',' or ']',
    but got '<stream end>' (while parsing a flow sequence at line 1, column 8)"."""
    mark, problem = getattr(e, "problem_mark", None), getattr(e, "problem", None)
    if mark is None or problem is None:
        return " ".join(str(e).split())

    def at(m) -> str:
        return f"line {m.line + 1}, column {m.column + 1}"

    context, context_mark = getattr(e, "context", None), getattr(e, "context_mark", None)
    where = f" at {at(context_mark)}" if context_mark is not None else ""
    return f"{at(mark)}: {problem}" + (f" ({context}{where})" if context else "")


def read_json(text: str) -> tuple[object, dict]:
    """JSON text -> (its data, {key path: line}), a key written twice in one object refused.
    The lines come from one pass over the (already valid) text: a string followed by ":"
    is a key, "{" and "[" open a level under the key or list item before them."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise _Refused(f"not valid JSON: {e}") from None
    lines, levels, key, i, line, counted = {}, [], (), 0, 1, 0
    while i < len(text):
        c = text[i]
        if c == '"':
            s, end = json.decoder.scanstring(text, i + 1)
            if text[json.decoder.WHITESPACE.match(text, end).end():][:1] == ":":
                line += text.count("\n", counted, i)
                counted = i
                key = levels[-1][0] + (s,)
                if key in lines:
                    raise _Refused(_given_twice(key, lines[key], line))
                lines[key] = line
            i = end
            continue
        if c in "{[":
            at = key if not levels or levels[-1][1] == "{" else levels[-1][0] + (levels[-1][2],)
            levels.append([at, c, 0])
        elif c in "}]":
            levels.pop()
        elif c == "," and levels[-1][1] == "[":
            levels[-1][2] += 1
        i += 1
    return data, lines


def config_file_args(path: str | Path) -> tuple[list[str], list[str]]:
    """A JSON or YAML config file -> (the flags it stands for: ["--steps=30",
    "--exchange.name=sharded", ...], the dotted keys set to null): a sub-config's mapping
    becomes its dotted flags."""
    path = Path(path)
    text = read_text(path)
    yaml_file = path.suffix.lower() in (".yaml", ".yml")
    try:
        data, lines = read_yaml(text) if yaml_file else read_json(text)
    except _Refused as e:
        raise ConfigFileError(f"--config {path}: {e}") from None
    except RecursionError:
        raise ConfigFileError(f"--config {path}: nested too deeply to be a config "
                              f"file") from None
    if not isinstance(data, dict):
        raise ConfigFileError(f"--config {path}: expected a mapping of field names to values, "
                              f"got {type(data).__name__}")
    flat, where = {}, {}
    for key, value in data.items():
        if key in (VERSION_KEY, FAST_PATH_KEY):
            continue
        pairs = ([(f"{key}.{k}", v, f"line {lines.get((key, str(k)), '?')} ({key}: {k}:)")
                  for k, v in value.items()]
                 if key in sub_configs() and isinstance(value, dict) else
                 [(str(key), value, f"line {lines.get((str(key),), '?')} ({key}:)")])
        for name, v, place in pairs:
            if name in flat:
                raise ConfigFileError(f"--config {path}: {name} is given twice: {where[name]} "
                                      f"and {place}: give it once")
            flat[name], where[name] = v, place
    try:
        flat, _ = translate(flat)                  # a TRL GRPOConfig's names (trl_keys.py)
    except ValueError as e:
        raise ConfigFileError(f"--config {path}: {e}") from None
    return ([f"--{k}={flag_text(v, k, path)}" for k, v in flat.items() if v is not None],
            [k for k, v in flat.items() if v is None])


def field_of(key: str) -> dataclasses.Field | None:
    """The field a dotted field name names (``compression.momentum``), or None for none."""
    sub, _, name = key.rpartition(".")
    if sub and sub not in sub_configs():
        return None
    cls = type(getattr(TrainConfig(), sub)) if sub else TrainConfig
    return next((f for f in dataclasses.fields(cls) if f.name == name), None)


def nullable(key: str) -> bool:
    """True for a dotted field name whose default is None (``compression.momentum``: a
    ``float | None`` field); a flag cannot say None, a config file can (null)."""
    field = field_of(key)
    return field is not None and field.default is None
