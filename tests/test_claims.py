"""The claims table (grpo_lab.claims): a verdict for every row, and the cheap measurements
against values worked out by hand."""
import math
import re
from pathlib import Path

import pytest
import torch

from grpo_lab import claims as C

ROOT = Path(__file__).resolve().parents[1]


def test_the_claims_table_has_a_verdict_for_every_row():
    assert [c.number for c in C.CLAIMS] == list(range(1, 26))
    for c in C.CLAIMS:
        assert c.verdict in C.VERDICTS, (c.number, c.verdict)
        assert c.why.strip() and c.remember.strip() and c.claim.strip() and c.fair_test.strip(), c.number
        if c.verdict in ("holds only as", "open"):          # as what / what would settle it
            assert c.qualifier.strip(), c.number
        else:
            assert not c.qualifier, c.number
    rows = C.table(live=False)
    assert len(rows) == 25 and all(r["verdict"] and r["measured"] for r in rows)
    assert {c.number for c in C.CLAIMS if c.verdict == "cannot be tested here"} == {14, 17, 19, 24}


def test_claims_text_matches_claims_md():
    """The claim, scale and fair test are CLAIMS.md's own text (when the shared file is here)."""
    md = ROOT.parent / "shared" / "CLAIMS.md"
    if not md.exists():
        pytest.skip("../shared/CLAIMS.md not in this checkout")
    rows = {}
    for line in md.read_text().splitlines():
        if re.match(r"^\| \d+ \|", line):
            num, claim, scale, test = (x.strip() for x in line.strip().strip("|").split(" | "))
            rows[int(num)] = (claim, scale, test)
    assert {c.number: (c.claim, c.scale, c.fair_test) for c in C.CLAIMS} == rows


def test_quoted_bench_numbers_are_in_their_files():
    """Every quoted measurement names a file that holds the exact text it was read from."""
    for c in C.CLAIMS:
        if c.quote:
            path, text = c.quote
            assert text in (ROOT / path).read_text(), (c.number, path, text)
            assert path.split("/")[-1] in c.source, c.number


def test_claim_20_relative_reward_is_constant_per_group_and_its_gradient_zero():
    m = C.relative_reward_gradient()
    # group 0: rewards 1, 0, 0, 1: mean 0.5, unbiased std sqrt(1/3); group 1: 0.5, 0.5, 0, 1: mean 0.5,
    # std sqrt(0.5/3)
    R0, R1 = math.sqrt(1 / 3) - 0.5, math.sqrt(0.5 / 3) - 0.5
    torch.testing.assert_close(m["R"], torch.tensor([R0] * 4 + [R1] * 4, dtype=torch.float64))
    for name, a in m["advantages"].items():
        assert torch.all(a == 0), name                     # exactly zero, every estimator
    assert torch.all(m["grad"] == 0)                       # no gradient at all
    assert m["grad_grpo"].abs().max() > 0.01               # GRPO's own advantage does move the policy


def test_claim_3_entropy_bound_at_5_percent():
    b = C.index_bound()
    assert abs(b["bits"] - 5.73) < 0.01                    # H(0.05)/0.05 = 0.2864/0.05
    assert abs(b["vs_int32"] - 5.59) < 0.01 and b["vs_int32"] < 8
    assert 0.15 < b["density_8to1"] < 0.16                 # H(d)/d = 4 at d ~ 15.6%


def test_claim_16_bytes_saved_against_fp32():
    f = C.format_savings()
    assert f["fp16"] == 0.5 and f["int8"] == 0.75
    assert f["int8_block_scaled"] == 1 - (1 + 4 / 128) / 4


def test_claim_18_per_shard_and_total_work():
    w = C.shard_work(m=80, n=320, k=4, batch=64)
    assert w["per_shard_elements"] == [6400] * 4 and w["total_elements"] == 80 * 320
    assert w["total_flops"] == 4 * w["per_shard_flops"] == 2 * 64 * 80 * 320
    assert w["equal"]


def test_claim_13_prompt_cache_bytes():
    k = C.prompt_kv_bytes()                                # toy: 3 layers x 80, fp32
    assert k["per_token"] == 2 * 3 * 80 * 4 == 1920
    assert k["copied"] == 16 * 8 * 6 * 1920 + 16 * 8 * 4 * 1920
    assert k["shared"] == 16 * 6 * 1920 + 16 * 8 * 4 * 1920
    assert k["saved"] == pytest.approx(7 / 8 * 6 / 10)
    s = C.prompt_cache_storage()                           # measured storage of the tensors
    assert s["once"] == s["viewed"] == 16 * 6 * 1920 and s["copied"] == 8 * s["once"]


def test_claim_11_every_sample_goes_through_backward():
    assert C.backward_rows(N=32, group_sizes=(2, 4, 8, 16, 32)) == {2: 32, 4: 32, 8: 32, 16: 32, 32: 32}


def test_claims_5_and_6_cost_model_figures():
    f = C.cluster_figures()
    assert f["mem_total_gb"] == pytest.approx(2800) and f["mem_zero3_4_gb"] == pytest.approx(700)
    assert f["floor_fp32_s"] > 1.2 and f["floor_bf16_s"] > 0.42       # both claimed times are below the floor
    assert f["best_fp32_s"] >= f["floor_fp32_s"]


def test_claim_2_fp8_error_is_percents():
    g = torch.randn(10_000, generator=torch.Generator().manual_seed(0))
    e = C.fp8_errors({"w": g, "zero": torch.zeros(3)})
    assert set(e) == {"w"} and 0.003 < e["w"] < 2 ** -4   # above 0.3%, below the per-value bound


def test_live_table_measurements_are_cheap_ones(monkeypatch):
    monkeypatch.setattr(C, "real_gradient", lambda steps=1: {"w": torch.ones(4) * torch.tensor([1.0, 0.3, 0.1, 0.05])})
    rows = {r["number"]: r for r in C.table(live=True)}
    assert "5.73 bits" in rows[3]["measured"] and "50%" in rows[16]["measured"]
    assert "gradient max 0.0" in rows[20]["measured"] and "G=16: 32" in rows[11]["measured"]
