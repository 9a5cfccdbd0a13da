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
        warnings.simplefilter("ignore")         # group_k defaults of the mixture preset
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
                 exchange={"name": "compressed", "momentum": 0.9, "timeout_s": 77.0},
                 report_to="tensorboard")
    got = config_of(["--config", write(tmp_path, to_dict(cfg))])
    assert got == cfg != preset("quick")
    assert (got.lr, got.exchange.momentum, got.report_to) == (3.3e-4, 0.9, "tensorboard")


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
    cfg = config_of(["--config", write(tmp_path, {"exchange": {"momentum": None}})])
    assert cfg.exchange.momentum is None


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
    ({"drop_finished": "maybe"}, "--drop_finished=maybe"),
    ({"steps": True}, "--steps=true"),
    ({"reward_weights": {"accuracy": "x"}}, "--reward_weights=accuracy=x"),
    ({"preset": "nope"}, "--preset=nope"),                             # bad choice
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


def test_a_missing_file_is_named(tmp_path, capsys):
    line = error_of(["--config", str(tmp_path / "nope.json")], capsys)
    assert "nope.json: cannot read it (No such file or directory)" in line
