"""Step variants as records (variants.py): which records a config turns on, in the order the
step calls them; the paper's loss with a variant's term added by hand; and a variant written
in a plugin file with its own settings block, trained end to end with its hooks' effect
checked per row."""
import json
from functools import partial
from pathlib import Path

import pytest
import torch

from grpo_lab.algorithm import variants
from grpo_lab.algorithm.loss import KL, Clip, grpo_loss, surrogate_loss
from grpo_lab.cli import main
from grpo_lab.training.config import from_dict, preset, to_dict
from grpo_lab.training.step import grpo_stat_keys
from grpo_lab.training.trainer import train


def names(cfg) -> list[str]:
    return [v.name for v in variants.active_variants(cfg)]


def test_a_config_turns_on_its_records_in_the_order_of_the_arithmetic():
    assert names(preset("tiny_cpu")) == []                          # beta 0: plain GRPO
    assert names(preset("defaults")) == ["kl_loss"]                 # beta 0.02 in the loss
    cfg = preset("defaults", overlong={"rule": "soft"}, kl={"placement": "reward", "estimator": "k1"},
                 tis={"cap": 2.0}, top_entropy={"quantile": 0.5}, entropy_bonus={"coef": 0.01})
    assert names(cfg) == ["overlong", "kl_reward", "tis", "top_entropy", "entropy_bonus"]
    assert names(preset("defaults", kl={"beta": 0.0}, supervision="process")) == ["process"]
    assert grpo_stat_keys(preset("defaults", tis={"cap": 2.0}, clip={"dual_clip": 3.0})) == (
        "loss/total", "clip/low_frac", "clip/high_frac", "clip/ratio_mean", "policy/entropy",
        "loss/kl", "loss/kl_k3", "sample/logprob_gap", "sample/tis_capped_frac",
        "clip/dual_frac")


def test_a_term_is_added_to_each_token_before_the_aggregation():
    # on-policy (ratio 1), A = +1 on 3 real tokens of 4: the clip surrogate is -1 per token;
    # a term of 0.5 per token under token_mean gives -1 + 0.5 = -0.5, its stat passed through
    logp = torch.tensor([[-1.0, -2.0, -0.5, 7.0]])
    mask = torch.tensor([[True, True, True, False]])
    seen = []

    def half(lp, old, real):
        seen.append((lp.clone(), real.clone()))
        return torch.full_like(lp, 0.5), {"x/half": 0.5}

    loss, stats = surrogate_loss(logp, logp, torch.tensor([1.0]), mask, Clip(eps_high=0.2),
                                 "token_mean", terms=[half])
    assert float(loss) == -0.5 and stats["x/half"] == 0.5
    assert seen[0][0].tolist() == [[-1.0, -2.0, -0.5, 0.0]]        # padding given as 0
    assert float(surrogate_loss(logp, logp, torch.tensor([1.0]), mask, Clip(eps_high=0.2),
                                "token_mean")[0]) == -1.0


def test_grpo_loss_is_the_surrogate_with_the_kl_as_a_term():
    # beta * k3 at log(pi_ref/pi) = d on one token: e^d - d - 1 (eq. 4); d = 0.5
    lp = torch.zeros(1, 1, requires_grad=True)
    ref = torch.tensor([[0.5]])
    loss, stats = grpo_loss(lp, lp.detach(), [0.0], torch.ones(1, 1, dtype=torch.bool),
                            kl=KL(beta=0.1), ref_logp=ref)
    k3 = torch.exp(torch.tensor(0.5)) - 0.5 - 1
    assert stats["loss/kl"] == pytest.approx(float(k3), abs=1e-7)
    assert float(loss.detach()) == pytest.approx(0.1 * float(k3), abs=1e-8)   # A = 0: KL alone


def test_grpo_loss_composes_the_loss_as_the_step_does():
    # the step: surrogate_loss with the active variants' terms (kl_loss, entropy_bonus);
    # grpo_loss: the config's blocks themselves. One path: equal bit for bit, stats too
    cfg = preset("defaults", kl={"beta": 0.1, "estimator": "k2", "clamp": 3.0},
                 entropy_bonus={"coef": 0.01}, clip={"dual_clip": 3.0, "log_ratio_clamp": 20.0},
                 loss={"aggregation": "token_mean"})
    g = torch.Generator().manual_seed(0)
    logp, old, ref, H = (-torch.rand(3, 4, generator=g) * 3 for _ in range(4))   # (N, T) each
    A, mask = torch.randn(3, generator=g), torch.rand(3, 4, generator=g) > 0.3
    t = variants.Tokens(logp, old, old, H, mask, A, {"ref": ref})
    terms = [partial(v.term, cfg, t) for v in variants.active_variants(cfg) if v.term is not None]
    assert len(terms) == 2
    step = surrogate_loss(logp, old, A, mask, cfg.clip, cfg.loss.aggregation, 4,
                          cfg.loss.ratio_level, cfg.loss.policy, None, terms, checked=True)
    alone = grpo_loss(logp, old, A, mask, cfg.clip, cfg.kl, cfg.entropy_bonus, cfg.loss.aggregation, 4,
                      cfg.loss.ratio_level, cfg.loss.policy, ref_logp=ref, entropy=H)
    assert torch.equal(step[0], alone[0]) and step[1] == alone[1]
    assert "loss/kl_k2" in alone[1] and float(alone[0]) != float(grpo_loss(logp, old, A, mask, cfg.clip)[0])


# ---- a new variant with a setting: one record and its settings block, in a plugin file

PLUGIN = str(Path(__file__).parent / "plugins" / "length_bonus.py")


def test_a_term_hook_of_the_older_two_argument_form_is_refused_naming_the_variant(monkeypatch):
    monkeypatch.setattr(variants, "VARIANTS", dict(variants.VARIANTS))
    with pytest.raises(TypeError, match=r"step variant 'old_bonus': its term hook must take "
                                        r"\(cfg, t, logp, old, real\).*got old_term\(cfg, t\)"):
        def old_term(cfg, t):
            return t.logp
        variants.register_variant("old_bonus", lambda cfg: False, term=old_term)
    assert "old_bonus" not in variants.VARIANTS


def test_a_plugin_variant_with_a_setting_trains_end_to_end(tmp_path, forget_plugin):
    kw = dict(steps=4, eval_size=0, threads=1, plugins=PLUGIN)
    cfg = preset("quick", out_dir=str(tmp_path / "bonus"), length_bonus={"weight": 0.1}, **kw)
    assert cfg.length_bonus.weight == 0.1 and to_dict(cfg)["length_bonus"] == {"weight": 0.1}
    assert from_dict(to_dict(cfg)) == cfg                      # config.json round-trips it
    rows = [h for h in train(cfg, progress=False) if h["step"] >= 0]
    assert len(rows) == 4
    w = cfg.reward_weights
    for h in rows:                         # the reward is shaped as the hook says, every step
        assert h["reward/length_bonus"] == pytest.approx(0.1 * h["completion/mean_len"],
                                                         abs=1e-6)
        raw = sum(w[k] * h[f"reward/{k}"] for k in w)
        assert h["reward/mean"] == pytest.approx(raw + h["reward/length_bonus"], abs=1e-6)
        assert h["bonus/len_mean"] == h["completion/mean_len"]      # one process: share 1
    # the block checks itself, and its default (0) turns the variant off
    with pytest.raises(ValueError, match="length_bonus.weight must be in \\[0, 1\\], got 2"):
        preset("quick", length_bonus={"weight": 2.0}, **kw)
    plain = train(preset("quick", out_dir=str(tmp_path / "plain"), **{**kw, "steps": 1}),
                  progress=False)
    assert "reward/length_bonus" not in plain[-1] and "bonus/len_mean" not in plain[-1]
    # the command line and a config file reach it the way they reach the built-in blocks
    out = tmp_path / "cli"
    assert main(["train", "--preset", "quick", "--plugin", PLUGIN, "--length_bonus.weight",
                 "0.1", "--steps", "1", "--eval_size", "0", "--threads", "1",
                 "--out_dir", str(out)]) == 0
    saved = json.loads((out / "config.json").read_text())
    assert saved["length_bonus"] == {"weight": 0.1}
    assert main(["train", "--config", str(out / "config.json"), "--out_dir",
                 str(tmp_path / "again")]) == 0
    assert "reward/length_bonus" in json.loads(
        (tmp_path / "again" / "metrics.jsonl").read_text().splitlines()[-1])


def test_a_config_file_naming_a_plugin_reaches_its_settings_block(tmp_path, forget_plugin):
    """The file's plugins are imported before its keys are read: with the plugin not yet
    loaded (a fresh process) its block's key was an unknown flag, --length_bonus=weight=0.1."""
    from grpo_lab.registry import SETTINGS
    assert "length_bonus" not in SETTINGS                  # forget_plugin: not loaded here
    path = tmp_path / "bonus.json"
    path.write_text(json.dumps({"preset": "quick", "plugins": PLUGIN, "steps": 1,
                                "length_bonus": {"weight": 0.1}, "eval_size": 0, "threads": 1,
                                "out_dir": str(tmp_path / "run")}))
    assert main(["train", "--config", str(path)]) == 0
    last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["reward/length_bonus"] == pytest.approx(0.1 * last["completion/mean_len"],
                                                        abs=1e-6)
