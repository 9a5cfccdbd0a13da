"""The workshop's GSPO-ratio and KL-estimator checks: a right answer passes, each usual
mistake fails with its own hint, a stub fails with 'not written yet'."""
import torch
import pytest

from grpo_lab.teaching import exercises as ex


def verdict(check, fn, capsys):
    ok = check(fn)
    return ok, capsys.readouterr().out


def gspo(logp, old, mask):
    return torch.exp(((logp - old) * mask).sum(1) / mask.sum(1))


GSPO_WRONG = [
    (lambda l, o, m: torch.exp(((l - o) * m).sum(1)), "not of the sum"),
    (lambda l, o, m: (torch.exp(l - o) * m).sum(1) / m.sum(1), "then exponentiate"),
    (lambda l, o, m: torch.exp(((l - o) * m).sum(1) / m.shape[1]), "own length"),
    (lambda l, o, m: torch.exp((l - o).sum(1) / m.sum(1)), "multiply the log-ratios by the mask"),
]


def kl(logp, ref):
    d = ref - logp
    return -d, d ** 2 / 2, torch.exp(d) - 1 - d


KL_WRONG = [
    (lambda l, r: kl(r, l), "you used logp - ref_logp"),
    (lambda l, r: (r - l, *kl(l, r)[1:]), "k1 = -log r"),
    (lambda l, r: (kl(l, r)[0], (r - l) ** 2, kl(l, r)[2]), "forgot the 1/2"),
    (lambda l, r: (*kl(l, r)[:2], -kl(l, r)[2]), "never negative"),
]


def test_right_answers_pass(capsys):
    assert verdict(ex.check_gspo_ratio, gspo, capsys)[0]
    assert verdict(ex.check_kl_estimators, kl, capsys)[0]


@pytest.mark.parametrize("check, fn, hint",
                         [(ex.check_gspo_ratio, f, h) for f, h in GSPO_WRONG] +
                         [(ex.check_kl_estimators, f, h) for f, h in KL_WRONG])
def test_each_mistake_fails_with_its_hint(check, fn, hint, capsys):
    ok, out = verdict(check, fn, capsys)
    assert not ok and hint in out, out


def test_stub_and_non_function(capsys):
    def stub(*a):
        raise NotImplementedError()
    for check in (ex.check_gspo_ratio, ex.check_kl_estimators):
        ok, out = verdict(check, stub, capsys)
        assert not ok and "not written yet" in out
        with pytest.raises(TypeError, match="got int 42"):
            check(42)
    ok, out = verdict(ex.check_kl_estimators, lambda l, r: 3, capsys)   # not a triple
    assert not ok and "return what the docstring says" in out, out
