"""``grpo-lab train --config FILE``: the flags' fields in a JSON or YAML file, read by the flags'
own parsers (so the same errors), flags winning over the file, the preset under both; a run's
out_dir/config.json read back gives the identical config."""
import json
import warnings

import pytest

from grpo_lab.cli import build_parser, main, train_config
from grpo_lab.training.config import PRESETS, TrainConfig, preset, to_dict


def config_of(argv: list[str]) -> TrainConfig:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")         # group.k defaults of the mixture preset
        return train_config(build_parser().parse_args(["train", *argv]))


def write(tmp_path, data, name="run.json") -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_a_resolved_config_round_trips_through_json(tmp_path, name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = preset(name)
    got = config_of(["--config", write(tmp_path, to_dict(cfg))])
    assert got == cfg and to_dict(got) == to_dict(cfg)


def test_a_changed_field_round_trips_too_and_differs_from_the_preset(tmp_path):
    cfg = preset("quick", lr=3.3e-4, reward_weights={"accuracy": 1.0}, answer_format="raw",
                 exchange={"name": "compressed", "timeout_s": 77.0},
                 compression={"momentum": 0.9}, report_to="tensorboard")
    got = config_of(["--config", write(tmp_path, to_dict(cfg))])
    assert got == cfg != preset("quick")
    assert (got.lr, got.compression.momentum, got.report_to) == (3.3e-4, 0.9, "tensorboard")


def test_yaml_nested_or_dotted_keys_and_the_preset_under_flags(tmp_path):
    pytest.importorskip("yaml")
    path = write(tmp_path, "preset: quick\nsteps: 7\nlr: 1e-3\nexchange:\n  timeout_s: 99\n"
                           "ppo.gamma: 0.5\nreward_weights: {accuracy: 2, format: 0.5}\n",
                 "run.yaml")
    cfg = config_of(["--config", path])
    assert (cfg.steps, cfg.lr, cfg.exchange.timeout_s, cfg.ppo.gamma) == (7, 1e-3, 99.0, 0.5)
    assert cfg.reward_weights == {"accuracy": 2.0, "format": 0.5}
    assert cfg.eval_every == PRESETS["quick"]["eval_every"] == 10          # the file's preset
    flags = config_of(["--config", path, "--steps", "5", "--exchange.timeout_s", "12"])
    assert (flags.steps, flags.lr, flags.exchange.timeout_s) == (5, 1e-3, 12.0)   # flags win
    other = config_of(["--config", path, "--preset", "defaults"])       # the flag's preset
    assert (other.eval_every, other.steps, other.lr) == (TrainConfig().eval_every, 7, 1e-3)


def test_null_is_none_only_where_the_field_may_be_none(tmp_path):
    cfg = config_of(["--config", write(tmp_path, {"compression": {"momentum": None}})])
    assert cfg.compression.momentum is None


def error_of(argv, capsys) -> str:
    """The last stderr line of ``grpo-lab train ARGV``, through argparse's exit or main's."""
    try:
        code = main(["train", *argv])
    except SystemExit as e:                          # argparse refusing a flag
        code = e.code
    assert code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("data, flag", [
    ({"stepz": 3}, "--stepz=3"),                                         # unknown key
    ({"exchange": {"nme": "x"}}, "--exchange.nme=x"),                   # unknown nested key
    ({"steps": 2.5}, "--steps=2.5"),                                    # wrong type
    ({"sampler": {"drop_finished": "maybe"}}, "--sampler.drop_finished=maybe"),
    ({"steps": True}, "--steps=true"),
    ({"reward_weights": {"accuracy": "x"}}, "--reward_weights=accuracy=x"),
    ({"preset": "nope"}, "--preset=nope"),                             # bad choice
    ({"group_k": 3}, "--group_k=3"),              # a flat name: both name group.k
])
def test_a_bad_key_or_type_gets_the_flags_error(tmp_path, capsys, data, flag):
    out = ["--out_dir", str(tmp_path / "run")]
    by_flag = error_of([flag, *out], capsys)
    path = write(tmp_path, data)
    by_file = error_of(["--config", path, *out], capsys)
    message = by_flag.split("error: ", 1)[1]                    # "argument --steps: invalid ..."
    assert by_file == f"grpo-lab: error: --config {path}: {message}"
    assert flag.split("=")[-1] in message                        # it names the value
    assert not (tmp_path / "run").exists()                       # refused before any work


@pytest.mark.parametrize("data, flag", [
    ({"steps": 0}, "--steps=0"),                                         # bad value
    ({"exchange": {"name": "nope"}}, "--exchange.name=nope"),
    ({"report_to": "tensorbord"}, "--report_to=tensorbord"),
    ({"lr": 5.0}, "--lr=5.0"),
])
def test_a_bad_value_gets_the_flags_error(tmp_path, capsys, data, flag):
    out = ["--out_dir", str(tmp_path / "run")]
    by_flag = error_of([flag, *out], capsys)
    assert error_of(["--config", write(tmp_path, data), *out], capsys) == by_flag
    assert flag.split("=")[-1] in by_flag
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("text, said", [
    ('{"task": null}', "task: null is no value here"),
    ('{"steps": null}', "argument --steps: invalid int value: 'null'"),
    ('{"nope": null}', "unrecognized arguments: --nope=null"),
    ("[1, 2]", "expected a mapping of field names to values, got list"),
    ('{"steps": 3', "not valid JSON"),
])
def test_a_malformed_file_is_named_with_the_cause(tmp_path, capsys, text, said):
    path = write(tmp_path, text)
    line = error_of(["--config", path, "--out_dir", str(tmp_path / "run")], capsys)
    assert line.startswith(f"grpo-lab: error: --config {path}: ") and said in line


@pytest.mark.parametrize("data, said", [
    ({"out_dir": ["a"]}, 'out_dir: a list ["a"] is no value here (the field takes one value)'),
    ({"task": ["addition", "sort"]}, 'task: a list ["addition", "sort"] is no value here'),
    ({"system_prompt": {"a": 1}}, 'system_prompt: a dict {"a": 1} is no value here'),
    ({"kl": {"beta": [0.1]}}, "kl.beta: a list [0.1] is no value here"),
    ({"reward_weights": [1.0, 0.5]},                    # TRL's form: a weight per function
     "reward_weights: a list [1.0, 0.5] is no value here (the field takes a mapping"),
])
def test_a_list_or_mapping_for_a_field_of_one_value_is_refused(tmp_path, capsys, data, said):
    """A list or mapping reached its flag as Python's text: {"out_dir": ["a"]} trained into a
    folder named ['a'], {"task": ["addition"]} was 'unknown task "['addition']"'."""
    path, out = write(tmp_path, data), tmp_path / "run"
    line = error_of(["--config", path, "--steps", "2", "--out_dir", str(out)], capsys)
    assert line.startswith(f"grpo-lab: error: --config {path}: {said}")
    assert not out.exists()                                      # refused before any work


def test_a_missing_file_is_named(tmp_path, capsys):
    line = error_of(["--config", str(tmp_path / "nope.json")], capsys)
    assert "nope.json: cannot read it (No such file or directory)" in line


# --- hostile files: each is refused fast, naming the file and what is wrong -----------------

BOMB = ('a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n'
        'b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n'
        'd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n'
        'f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\ng: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n'
        'h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]\ni: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]\n')


def file_error(tmp_path, capsys, text, name) -> tuple[str, str]:
    path = tmp_path / name
    path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text)
    return error_of(["--config", str(path), "--out_dir", str(tmp_path / "run")], capsys), \
        str(path)


@pytest.mark.parametrize("key", ["steps", "stepz"])          # a known key and an unknown one
def test_a_yaml_anchor_bomb_is_refused_before_it_expands(tmp_path, capsys, key):
    pytest.importorskip("yaml")
    import time
    text = BOMB.replace("i: &i", f"{key}: &i")
    assert len(BOMB) < 500                              # 9**9 strings once expanded
    t0 = time.process_time()
    line, path = file_error(tmp_path, capsys, text, "bomb.yaml")
    assert time.process_time() - t0 < 1.0              # CPU time: refused at the first anchor
    assert line == (f"grpo-lab: error: --config {path}: line 1: YAML anchors and aliases "
                    f"(&a) are not read in a config file: write each value out")


def test_a_yaml_alias_alone_is_refused_naming_its_line(tmp_path, capsys):
    pytest.importorskip("yaml")
    line, path = file_error(tmp_path, capsys, "steps: 3\nlr: *x\n", "alias.yaml")
    assert line.startswith(f"grpo-lab: error: --config {path}: line 2: YAML anchors and "
                           f"aliases (*x) are not read")


@pytest.mark.parametrize("text, said", [
    ("steps: [2\n", "line 2, column 1: expected ',' or ']', but got '<stream end>' (while "
                    "parsing a flow sequence at line 1, column 8)"),
    ("steps: 2\n\tlr: 1\n", "line 2, column 1: found character '\\t' that cannot start any "
                            "token (while scanning for the next token)"),
    ("a: b: c\n", "line 1, column 5: mapping values are not allowed here"),
])
def test_invalid_yaml_is_one_line_naming_where(tmp_path, capsys, text, said):
    """PyYAML's message is several lines (the file's line quoted, a caret under it): the error
    printed was six lines, its last a lone '^'."""
    pytest.importorskip("yaml")
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert main(["train", "--config", str(path), "--out_dir", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == f"grpo-lab: error: --config {path}: not valid YAML: {said}\n"


@pytest.mark.parametrize("name, text, said", [
    ("twice.yaml", "steps: 3\nlr: 0.1\nsteps: 4\n",
     "steps is given twice: line 1 and line 3"),
    ("nested.yaml", "exchange:\n  name: sharded\n  timeout_s: 5\n  name: compressed\n",
     "exchange.name is given twice: line 2 and line 4"),
    ("both.yaml", "exchange: {name: sharded}\nsteps: 3\nexchange.name: compressed\n",
     "exchange.name is given twice: line 1 (exchange: name:) and line 3 (exchange.name:)"),
    ("dotted_first.yaml", "exchange.name: compressed\nexchange:\n  name: sharded\n",
     "exchange.name is given twice: line 1 (exchange.name:) and line 3 (exchange: name:)"),
    ("reward.yaml", "reward_weights: {accuracy: 1, accuracy: 2}\n",
     "reward_weights.accuracy is given twice: line 1 and line 1"),
    ("twice.json", '{"steps": 3,\n "lr": 0.1,\n "steps": 4}',
     "steps is given twice: line 1 and line 3"),
    ("nested.json", '{"exchange": {"name": "sharded",\n  "name": "compressed"}}',
     "exchange.name is given twice: line 1 and line 2"),
    ("both.json", '{"exchange": {"name": "sharded"},\n "exchange.name": "compressed"}',
     "exchange.name is given twice: line 1 (exchange: name:) and line 2 (exchange.name:)"),
])
def test_a_key_given_twice_is_refused_naming_both_places(tmp_path, capsys, name, text, said):
    if name.endswith(".yaml"):
        pytest.importorskip("yaml")
    line, path = file_error(tmp_path, capsys, text, name)
    assert line == f"grpo-lab: error: --config {path}: {said}: give it once"


def test_the_same_key_in_two_list_items_or_two_mappings_is_no_duplicate(tmp_path):
    cfg = config_of(["--config", write(tmp_path, '{"exchange": {"timeout_s": 9},\n'
                                                 ' "ppo": {"gamma": 0.5}, "steps": 4}')])
    assert (cfg.exchange.timeout_s, cfg.ppo.gamma, cfg.steps) == (9.0, 0.5, 4)


@pytest.mark.parametrize("name, data, said", [
    ("run.yaml", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",
     "not a text file: byte 0x89 at offset 0 is not UTF-8"),
    ("run.json", b'{"steps": 3}\x00\x00', "not a text file: a NUL byte at offset 12"),
    ("run.json", b'{"steps": "\xff"}', "not a text file: byte 0xff at offset 11 is not UTF-8"),
])
def test_binary_input_is_named(tmp_path, capsys, name, data, said):
    line, path = file_error(tmp_path, capsys, data, name)
    assert line == f"grpo-lab: error: --config {path}: {said}"


def test_a_file_past_the_size_cap_is_refused_unread(tmp_path, capsys):
    from grpo_lab.training.config_file import MAX_BYTES
    path = tmp_path / "big.yaml"
    with open(path, "wb") as f:                         # 100 MB of comments, sparse on disk
        f.write(b"# x\n")
        f.truncate(100 * 2**20)
    line = error_of(["--config", str(path)], capsys)
    assert line == (f"grpo-lab: error: --config {path}: 104,857,600 bytes, over the "
                    f"{MAX_BYTES:,}-byte limit for a config file (a run's config.json is "
                    f"about 3 kB)")


def test_a_deeply_nested_file_is_named(tmp_path, capsys):
    line, path = file_error(tmp_path, capsys, '{"a": ' * 30_000 + "1" + "}" * 30_000,
                            "deep.json")
    assert line == f"grpo-lab: error: --config {path}: nested too deeply to be a config file"


def test_a_yaml_file_of_deep_lists_is_named(tmp_path, capsys):
    pytest.importorskip("yaml")
    line, path = file_error(tmp_path, capsys, "steps: " + "[" * 30_000 + "]" * 30_000,
                            "deep.yaml")
    assert line == f"grpo-lab: error: --config {path}: nested too deeply to be a config file"
