"""Fault injection at the training level (issue 10, the trainer and CLI half; the library half is
tests/test_faults.py): resume restores its own run, nothing non-finite is saved, the CLI parses
strictly, checks before working, and reports every expected error as one line with exit 2."""
import json
from pathlib import Path

import pytest
import torch

from grpo_lab.checkpoint import read_training_checkpoint
from grpo_lab.cli import main
from grpo_lab.training.config import TrainConfig
from grpo_lab.distributed.exchanges import AdamW, ExchangeConfig, make_exchange
from grpo_lab.policies.model import GPT, GPTConfig

QUICK = ["--preset", "quick", "--eval_size", "10", "--threads", "1"]


def run(capsys, *args) -> tuple[int, str]:
    code = main(list(args))
    return code, capsys.readouterr().err


def test_resume_takes_the_saved_config_and_refuses_silent_changes(tmp_path, capsys):
    out = str(tmp_path / "mine")
    # the README's flow: a run with its own lr and estimator, stopped early (budget) ...
    assert run(capsys, "train", *QUICK, "--steps", "4", "--lr", "5e-5", "--advantage", "mean_centred",
               "--time_budget_s", "1e-9", "--out_dir", out)[0] == 0
    assert read_training_checkpoint(Path(out) / "checkpoint.safetensors")["step"] == 0
    # ... resumed with a flag that changes what it computes: an error naming field and values
    code, err = run(capsys, "train", "--out_dir", out, "--resume", "--lr", "1e-4")
    assert code == 2 and "lr: saved 5e-05, given 0.0001" in err and "--override" in err
    # ... resumed as the README says: the saved lr and estimator, not the defaults (time_budget_s
    # is a runtime field: changing it is allowed)
    assert run(capsys, "train", "--out_dir", out, "--resume", "--time_budget_s", "0")[0] == 0
    saved = read_training_checkpoint(Path(out) / "checkpoint.safetensors")
    assert saved["step"] == 3
    assert (saved["config"]["lr"], saved["config"]["advantage"]) == (5e-5, "mean_centred")
    rows = [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [-1, 0, 1, 2, 3]
    assert not any("resume/overrides" in r for r in rows)


def test_override_is_explicit_and_recorded(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert run(capsys, "train", *QUICK, "--steps", "3", "--time_budget_s", "1e-9",
               "--out_dir", out)[0] == 0
    code, err = run(capsys, "train", "--out_dir", out, "--override", "--lr", "2e-4")
    assert code == 2 and "--override only applies with --resume" in err
    assert run(capsys, "train", "--out_dir", out, "--resume", "--override", "--lr", "2e-4",
               "--time_budget_s", "0")[0] == 0
    rows = [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    assert rows[2]["step"] == 1 and rows[2]["resume/overrides"] == {"lr": [1e-4, 2e-4]}
    assert "Resumed at step 1 with a changed config** (lr 0.0001 -> 0.0002)" in \
        (Path(out) / "report.md").read_text()
    # what the saved state depends on never changes, even with --override
    code, err = run(capsys, "train", "--out_dir", out, "--resume", "--override", "--seed", "7")
    assert code == 2 and "cannot resume" in err and "'seed': 0" in err


def test_non_finite_weights_stop_the_run_and_keep_the_last_good_checkpoint(tmp_path, capsys,
                                                                           monkeypatch):
    out = tmp_path / "run"
    assert run(capsys, "train", *QUICK, "--steps", "2", "--ckpt_every", "1", "--time_budget_s",
               "0", "--out_dir", str(out))[0] == 0
    ckpt = out / "checkpoint.safetensors"
    good = ckpt.read_bytes()
    # an optimizer step that leaves a NaN in the weights (as an overflowing update would)
    step = torch.optim.AdamW.step

    def poisoned(self, *a, **k):
        out = step(self, *a, **k)
        with torch.no_grad():
            self.param_groups[0]["params"][0].view(-1)[5] = float("nan")
        return out
    monkeypatch.setattr(torch.optim.AdamW, "step", poisoned)
    code, err = run(capsys, "train", "--out_dir", str(out), "--resume", "--override",
                    "--steps", "4")
    assert code == 2 and "FloatingPointError: step 2: wte.weight is not finite" in err, err
    assert ckpt.read_bytes() == good                                       # byte for byte
    assert read_training_checkpoint(ckpt)["step"] == 1


def test_exchange_names_its_first_non_finite_tensor():
    model = GPT(GPTConfig(n_layer=1, n_embd=16, n_head=2, block_size=16))
    ex = make_exchange(model, ExchangeConfig(), AdamW(lr=1e-3))
    assert ex.bad_state() is None
    sum(p.sum() for p in model.parameters()).backward()
    ex.step()
    assert ex.bad_state() is None
    with torch.no_grad():
        ex.state_dict()["state"][1]["exp_avg_sq"].view(-1)[0] = float("inf")  # the live state
    assert ex.bad_state().startswith("optimizer exp_avg_sq of ")
    with torch.no_grad():
        model.ln_f.weight[3] = float("nan")
    assert ex.bad_state() == "ln_f.weight"                                 # parameters first


def test_the_summed_finite_check_names_the_same_tensor_as_an_element_wise_one():
    """first_non_finite checks one sum per tensor; a sum that overflows on finite elements is
    no alarm, and inf + -inf inside one tensor (a NaN sum) is found like a NaN."""
    from grpo_lab.distributed.exchanges import first_non_finite
    big = torch.full((4,), 3e38)                                           # sum overflows: finite
    ok = [("a", torch.ones(3)), ("big", big), ("step", torch.tensor(5.0)),
          ("ids", torch.ones(2, dtype=torch.long))]
    assert first_non_finite(ok) is None
    both = torch.tensor([1.0, float("inf"), -float("inf")])                # sum is NaN
    assert first_non_finite(ok + [("both", both), ("nan", torch.tensor([float("nan")]))]) == "both"
    late = torch.zeros(5, dtype=torch.float64)
    late[4] = float("-inf")
    assert first_non_finite(ok + [("late", late)]) == "late"
    assert first_non_finite([]) is None


@pytest.mark.parametrize("flags,msg", [
    (["--lr", "inf"], "TrainConfig.lr must be a finite number, got inf"),
    (["--temperature", "inf"], "TrainConfig.temperature must be a finite number, got inf"),
    (["--kl.beta", "inf"], "kl.beta must be finite and >= 0, got inf"),
    (["--kl.beta", "-1"], "kl.beta must be finite and >= 0, got -1.0"),
    (["--clip.eps_high", "nan"], "eps_high must be finite and >= 0, got nan"),
    (["--eval_size", "-5"], "eval_size must be >= 0, got -5"),
    (["--eval_size", "100000"], "eval_size=100000 but the held-out set of 'addition' has 200"),
    (["--reward_weights", "accuracy=inf"], "reward weight of 'accuracy' must be a finite number"),
    (["--exchange.name", "sharded"], "exchange 'sharded' needs a process group"),
    (["--exchange.timeout_s", "0"], "exchange.timeout_s must be > 0, got 0.0"),
])
def test_bad_values_are_one_line_with_exit_2(tmp_path, capsys, flags, msg):
    code, err = run(capsys, "train", *QUICK, "--steps", "2", "--out_dir", str(tmp_path / "r"),
                    *flags)
    assert code == 2 and msg in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "r" / "checkpoint.safetensors").exists()


@pytest.mark.parametrize("text", ["ture", "2", "maybe", ""])
def test_bools_parse_strictly(tmp_path, capsys, text):
    with pytest.raises(SystemExit) as e:
        main(["train", "--dynamic.sampling", text, "--out_dir", str(tmp_path)])
    assert e.value.code == 2 and f"expected true/false, 1/0 or yes/no, got {text!r}" in \
        capsys.readouterr().err


def test_bools_accept_the_usual_spellings():
    from grpo_lab.cli import parse_bool
    assert [parse_bool(t) for t in ("true", "True", "1", "yes", "false", "0", "NO")] == \
        [True, True, True, True, False, False, False]


def test_unwritable_out_dir_is_found_before_any_work(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    code, err = run(capsys, "train", *QUICK, "--out_dir", str(blocker / "run"))
    assert code == 2 and "is not a writable folder" in err and "a_file" in err


def test_no_evaluation_with_eval_size_0(tmp_path, capsys):
    out = tmp_path / "r"
    assert run(capsys, "train", *QUICK, "--steps", "2", "--eval_size", "0",
               "--out_dir", str(out))[0] == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert not any("eval/accuracy" in r for r in rows)
    assert "No held-out evaluation (eval_size=0)" in (out / "report.md").read_text()
    assert TrainConfig(eval_size=0).eval_size == 0


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(ValueError, match="finite number"):
        main(["train", "--lr", "inf", "--debug", "--out_dir", str(tmp_path)])


def test_damaged_checkpoint_on_resume_is_one_line(tmp_path, capsys):
    out = tmp_path / "r"
    assert run(capsys, "train", *QUICK, "--steps", "2", "--out_dir", str(out))[0] == 0
    ckpt = out / "checkpoint.safetensors"
    data = bytearray(ckpt.read_bytes())
    data[-100] ^= 0x40                                                     # one bit in a tensor
    ckpt.write_bytes(bytes(data))
    code, err = run(capsys, "train", "--out_dir", str(out), "--resume")
    assert code == 2 and "is corrupt: content checksum" in err


def test_a_forged_optimizer_moment_is_refused_by_name_before_any_step(tmp_path, capsys):
    """A header that lies about a moment's shape (transposed, signed again) loaded without a
    word (torch's load_state_dict checks no shapes) and failed inside the first step after the
    rollout, as a RuntimeError naming neither the file nor the tensor; an index past the last
    parameter was dropped silently."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
    from grpo_lab.checkpoint import CHECKSUM_KEY, content_checksum
    out = tmp_path / "r"
    assert run(capsys, "train", *QUICK, "--steps", "3", "--time_budget_s", "1e-9",
               "--out_dir", str(out))[0] == 0
    ckpt = out / "checkpoint.safetensors"
    good = ckpt.read_bytes()
    for edit, said in [
        (lambda t: {**t, "optim.1.exp_avg": t["optim.1.exp_avg"].T.contiguous()},
         f"{ckpt}: tensor 'optim.1.exp_avg' has shape (80, 32), its parameter (32, 80)"),
        (lambda t: {**t, **{k.replace("optim.1.", "optim.99."): v.clone() for k, v in t.items()
                            if k.startswith("optim.1.")}},
         f"{ckpt} holds optimizer state of parameter 99; this run trains 40 parameters "
         f"(0 to 39)")]:
        ckpt.write_bytes(good)
        tensors = edit(load_file(ckpt))
        with safe_open(ckpt, "pt") as f:
            meta = {k: v for k, v in f.metadata().items() if k != CHECKSUM_KEY}
        save_file(tensors, ckpt, {**meta, CHECKSUM_KEY: content_checksum(tensors, meta)})
        code, err = run(capsys, "train", "--out_dir", str(out), "--resume")
        assert code == 2 and said in err and "before the first step" in err, err
