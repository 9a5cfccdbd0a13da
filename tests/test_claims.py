"""The claims table (grpo_lab.teaching.claims): a verdict for every row, every number traced to the file
or the computation it comes from, and the cheap measurements against values worked out by hand.
Nothing here reads outside the repository, so it runs (never skips) in any checkout."""
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from grpo_lab.teaching import claims as C
from grpo_lab.teaching import (claims_bytes, claims_data, claims_formulas, claims_gradient, claims_live,
                               claims_seeds, claims_stats, claims_systems)

ROOT = Path(__file__).resolve().parents[1]
NUMBER = re.compile(r"(?<![A-Za-z_\d.])\d+(?:,\d{3})*(?:\.\d+)?")   # not the 32 of fp32
CLAIM_REF = re.compile(r"[Cc]laims? \d+(?: and \d+)?")


def numbers(text: str) -> set:
    """The numbers written in ``text``, as written ("1,921", "0.85", "56"); single digits are
    left out (counts such as "3 seeds" or "2^-4" exponents)."""
    return {n for n in NUMBER.findall(CLAIM_REF.sub("", text)) if len(n) > 1}


def test_every_row_has_a_verdict():
    assert [c.number for c in C.CLAIMS] == list(range(1, 54))
    for c in C.CLAIMS:
        assert c.verdict in C.VERDICTS, (c.number, c.verdict)
        for text in (c.why, c.remember, c.claim, c.fair_test, c.measured):
            assert text.strip() and "{" not in text, (c.number, text)
        if c.parts:                                         # the first figure's verdict is the row's
            assert c.parts[0][1:] == (c.verdict, c.qualifier), c.number
        for _, verdict, qualifier in c.parts or [("", c.verdict, c.qualifier)]:
            assert verdict in C.VERDICTS, (c.number, verdict)
            if verdict in ("holds only as", "open"):         # as what / what would settle it
                assert qualifier.strip() and "{" not in qualifier, c.number
            else:
                assert not qualifier, c.number
        assert not c.live or c.live in claims_live.LIVE, c.number
    rows = C.table(live=False)
    assert len(rows) == 53 and all(r["verdict"] and r["measured"] for r in rows)
    bare = set(range(41, 54))                               # the write-ups' bare figures, one row each
    assert {c.number for c in C.CLAIMS if c.verdict == "cannot be tested here"} == {7, 14, 17, 19, 24} | bare
    assert {c.number for c in C.CLAIMS if c.verdict == "holds"} == {32, 33, 34}
    # 53 rows; rows 16 and 31 have two figures with verdicts of their own, row 21 three: 57 verdicts
    assert sum(C.counts().values()) == 53 + 1 + 1 + 2 and C.counts()["holds"] == 3


def test_row_21_verdict_is_split_by_figure():
    """2.3x refuted by the samples interval, +40% open on the wall-time interval, -62% never tested."""
    parts = {figure: (verdict, qualifier) for figure, verdict, qualifier in C.CLAIMS[20].parts}
    assert [v for v, _ in parts.values()] == ["does not hold", "open", "open"]
    assert "1.14x [0.60, 2.15]" in parts["+40% convergence"][1]
    assert "never tested" in parts["-62% syntax errors"][1]
    assert C.CLAIMS[20].verdict_text.startswith("2.3x sample efficiency: does not hold; +40% convergence: open")


def test_every_seed_claim_has_a_row():
    """The five write-ups' 72 checkable claims (counted by hand in reading order), numbered 1..n
    within each write-up; each names rows that exist, every row answers at least one of them,
    and data/claims.md's header states the count."""
    ids = [s.id for s in claims_seeds.SEEDS]
    assert len(ids) == 72 and len(set(ids)) == 72
    per = {}
    for i in ids:
        w, n = i.split(".")
        per.setdefault(w, []).append(int(n))
    assert list(per) == ["0", "1", "2", "3", "4"] and list(per) == list(claims_seeds.WRITE_UPS)
    assert {w: len(n) for w, n in per.items()} == {"0": 24, "1": 15, "2": 10, "3": 8, "4": 15}
    for w, n in per.items():
        assert n == list(range(1, len(n) + 1)), w           # reading order, no gap
    cov = claims_seeds.coverage(len(C.CLAIMS))
    assert cov == {"total": 72, "with_row": 72, "ids_without": []}
    assert {r for s in claims_seeds.SEEDS for r in s.rows} == set(range(1, len(C.CLAIMS) + 1))
    assert "Seed claims with a row: 72 of the 72 checkable claims" in (ROOT / "data" / "claims.md").read_text()
    assert claims_seeds.coverage(40)["ids_without"][:2] == ["0.2", "0.4"]   # rows past 40 do not count


def test_mixed_unit_scores_by_hand():
    m = claims_formulas.mixed_unit_scores()
    # small: var 1, norm sqrt(100) = 10; large: var 0.01, norm sqrt(40000 x 0.01) = 20; loss x s: var s^2, norm s
    assert m["importance"][1.0] == {"small": pytest.approx(0.7 + 3.0), "large": pytest.approx(0.007 + 6.0)}
    assert m["importance"][1024.0]["small"] == pytest.approx(0.7 * 1024 ** 2 + 3.0 * 1024)
    assert m["importance"][1024.0]["large"] == pytest.approx(0.007 * 1024 ** 2 + 6.0 * 1024)
    assert m["hpm"]["SI"]["B"] > m["hpm"]["SI"]["A"] and m["hpm"]["TFLOPS, GB/s, us"] == {"A": 3090.0, "B": 1690.0}
    t = m["time_s"]                                         # FLOPs / FLOP/s + bytes / (B/s) + 10 us
    assert t["compute-bound"]["A"] == pytest.approx(1e12 / 100e12 + 1e9 / 3000e9 + 1e-5)
    assert t["bandwidth-bound"]["B"] == pytest.approx(1e10 / 200e12 + 30e9 / 1500e9 + 1e-5)
    assert t["compute-bound"]["B"] < t["compute-bound"]["A"] and t["bandwidth-bound"]["A"] < t["bandwidth-bound"]["B"]


def test_length_weight_by_hand():
    """N = 3 completions, A = 1: GRPO's per-token weight 1/(N |o_i|), each completion's sum 1/N;
    Dr. GRPO's 1/(N T_max) for every token."""
    w = claims_formulas.length_weight(lengths=(4, 16, 64))
    for n, (tok, total) in w["seq_mean_token_mean"].items():
        assert tok == pytest.approx(1 / (3 * n)) and total == pytest.approx(1 / 3)
    for n, (tok, total) in w["dr_grpo"].items():
        assert tok == pytest.approx(1 / (3 * 64)) and total == pytest.approx(n / (3 * 64))


def test_mixed_group_by_hand():
    m = claims_formulas.mixed_group()
    # one group: mean 0.5, unbiased std sqrt((0.16 + 0.04 + 0.04 + 0.16) / 3); by prompt: +-0.1 / sqrt(0.02)
    # (GRPO divides by std + 1e-4)
    sd, pair = math.sqrt(0.4 / 3) + 1e-4, math.sqrt(0.02) + 1e-4
    assert m["one_group"] == pytest.approx([0.4 / sd, 0.2 / sd, -0.2 / sd, -0.4 / sd], rel=1e-12)
    assert m["by_prompt"] == pytest.approx([0.1 / pair, -0.1 / pair] * 2, rel=1e-12)
    assert m["flips"] == [1, 2] and m["equal"] == [0.0] * 4


def test_quotes_are_in_their_files():
    """Every quoted text is, exactly, in the repository file it names."""
    for c in C.CLAIMS:
        for path, text in c.quotes:
            assert (ROOT / path).exists(), (c.number, path)
            assert text in (ROOT / path).read_text(), (c.number, path, text)
        assert not c.quotes or any(p.split("/")[-1] in c.source for p, _ in c.quotes) or c.live, c.number


def test_every_number_is_backed_by_a_quote_or_the_live_measurement():
    """Each number in a row's measurement, verdict and why is in its quotes, in the claim or fair
    test as written, or in the measurement computed now (live rows)."""
    for c in C.CLAIMS:
        backed = numbers(c.claim + " " + c.fair_test + " " + " ".join(t for _, t in c.quotes))
        if c.live:
            backed |= numbers(C.measure(c.number))
        if c.number in (10, 21):                             # computed from the quoted per-seed lines
            backed |= numbers(claims_data._SAMPLES)
        for part in (c.measured, c.qualifier, c.why, *(q for _, _, q in c.parts)):
            missing = numbers(part) - backed
            assert not missing, (c.number, sorted(missing), part)


def test_live_rows_store_what_they_compute():
    """A live row's stored ``measured`` (data/claims.md shows it) holds what the code computes
    now (after any quoted bench figures); other rows show ``measured`` as stored."""
    for c in C.CLAIMS:
        if c.live:
            assert c.measured.endswith(C.measure(c.number)), c.number
        else:
            assert C.measure(c.number) == c.measured


def test_data_claims_md_is_the_rendered_list():
    assert (ROOT / "data" / "claims.md").read_text() == C.markdown()
    for c in C.CLAIMS:
        assert f"| {c.number} | " in C.markdown()


def test_claims_10_and_21_read_one_data_set_on_one_scale():
    """PPO's samples to the target over GRPO's, per seed from the quoted lines, geometric mean
    with the log-ratio interval: the same figure in both rows, and both exclude the claims
    (2.0-3.3x for "cuts samples 50-70%", 2.3x)."""
    md = (ROOT / "bench" / "RESULTS_grpo_vs_ppo.md").read_text()
    per = {v: [int(x) for x in re.findall(r"seed \d: (\d+),", re.search(rf"^- {v}: .*$", md, re.M).group(0))]
           for v in ("grpo 16x8", "ppo 128x1")}
    r = claims_stats.paired_ratio(per["ppo 128x1"], per["grpo 16x8"])
    text = (f"{r['mean']:.2f}x [{r['low']:.2f}, {r['high']:.2f}] (geometric mean of 3 paired seeds: "
            + ", ".join(f"{x:.2f}" for x in r["ratios"]))
    assert text in claims_data._SAMPLES
    assert f"PPO's samples to the target / GRPO's {r['mean']:.2f}x [{r['low']:.2f}, {r['high']:.2f}]" in md
    assert r["high"] < 1 / (1 - 0.5) == 2.0 and r["high"] < 2.3   # both claims excluded
    ten, twenty_one = C.CLAIMS[9], C.CLAIMS[20]
    assert ten.verdict == twenty_one.verdict == "does not hold"
    assert claims_data._SAMPLES in ten.measured and claims_data._SAMPLES in twenty_one.measured
    assert "[0.45, 1.56]" in ten.why and "[0.45, 1.56]" in twenty_one.why


def test_claims_11_and_18_are_judged_by_one_rule():
    """Both say splitting shrinks the work; both are judged on the total, with the per-part
    figure reported beside it."""
    assert C.CLAIMS[10].verdict == C.CLAIMS[17].verdict
    assert "Claim 18 is judged by the same rule" in C.CLAIMS[10].why
    assert "Claim 11 is judged by the same rule" in C.CLAIMS[17].why


def test_paired_ratio_by_hand():
    r = claims_stats.paired_ratio([2.0, 1.0], [1.0, 2.0])                # ratios 2 and 0.5: geometric mean 1
    assert r["ratios"] == [2.0, 0.5] and r["mean"] == pytest.approx(1.0)
    half = 12.706 * math.log(2) * math.sqrt(2) / math.sqrt(2)   # t(0.975, 1) x sd / sqrt(n)
    assert r["high"] == pytest.approx(math.exp(half), rel=1e-3) and r["low"] == pytest.approx(math.exp(-half), rel=1e-3)
    with pytest.raises(ValueError, match="3 numerators, 2 denominators"):
        claims_stats.paired_ratio([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match=r"ratios must be positive, got \[1.0, 0.0\]"):
        claims_stats.ratio_interval([1.0, 0.0])


def test_claim_20_relative_reward_is_constant_per_group_and_its_gradient_zero():
    m = claims_gradient.relative_reward_gradient()
    # group 0: rewards 1, 0, 0, 1: mean 0.5, unbiased std sqrt(1/3); group 1: 0.5, 0.5, 0, 1: mean 0.5,
    # std sqrt(0.5/3)
    R0, R1 = math.sqrt(1 / 3) - 0.5, math.sqrt(0.5 / 3) - 0.5
    torch.testing.assert_close(m["R"], torch.tensor([R0] * 4 + [R1] * 4, dtype=torch.float64))
    for name, a in m["advantages"].items():
        assert torch.all(a == 0), name                     # exactly zero, every estimator
    assert torch.all(m["grad"] == 0)                       # no gradient at all
    assert m["grad_grpo"].abs().max() > 0.01               # GRPO's own advantage does move the policy


def test_claim_3_entropy_bound_at_5_percent():
    b = claims_bytes.index_bound()
    assert abs(b["bits"] - 5.73) < 0.01                    # H(0.05)/0.05 = 0.2864/0.05
    assert abs(b["vs_int32"] - 5.59) < 0.01 and b["vs_int32"] < 8
    assert 0.15 < b["density_8to1"] < 0.16                 # H(d)/d = 4 at d ~ 15.6%


def test_claim_3_clustered_positions_code_below_the_random_bound():
    """A 'gradient' whose large entries all sit in one tensor, as a contiguous run: its global
    top 5% is one run of positions, which zstd codes far below the random-set bound. An i.i.d.
    Gaussian gradient's top 5% is a random set: no codec beats the bound on it."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(40_000, generator=gen) * 0.01
    a[1000:5000] += 10.0                                   # exactly the global top 5%: 4,000 of 80,000
    grads = {"a": a, "b": torch.randn(40_000, generator=gen) * 0.01}
    r = claims_bytes.topk_index_bits(grads, density=0.05)
    assert r["n"] == 80_000 and r["k"] == 4_000
    assert r["share_top_tensor"] == 1.0                    # every global top-k position is in "a"
    assert r["global"]["zstd"] < 0.5 * r["bound"]
    iid = claims_bytes.topk_index_bits({"w": torch.randn(80_000, generator=gen)}, density=0.05)
    for codec, bits in iid["global"].items():
        assert bits > 0.99 * iid["bound"], codec
    assert iid["per_tensor"] == iid["global"]              # one tensor: the same index set


def test_claim_16_bytes_saved_against_fp32():
    f = claims_bytes.format_savings()
    assert f["fp16"] == 0.5 and f["int8"] == 0.75
    assert f["int8_block_scaled"] == 1 - (1 + 4 / 128) / 4


def test_claim_16_measured_message_bytes():
    """Dense messages of the same tensors: fp32 - fp16 = 2 bytes per element, fp32 - e4m3 = 3
    bytes per element minus e4m3's one 4-byte scale per tensor (same headers)."""
    g = {"w": torch.randn(1000), "b": torch.randn(24)}
    b = claims_bytes.exchange_bytes(g)
    assert b["fp32"] - b["fp16"] == 2 * 1024
    assert b["fp32"] - b["e4m3"] == 3 * 1024 - 2 * 4


def test_claim_18_per_shard_and_total_work():
    w = claims_systems.shard_work(m=80, n=320, k=4, batch=64)
    assert w["per_shard_elements"] == [6400] * 4 and w["total_elements"] == 80 * 320
    assert w["total_flops"] == 4 * w["per_shard_flops"] == 2 * 64 * 80 * 320
    assert w["equal"]


def test_claim_13_prompt_cache_bytes():
    k = claims_systems.prompt_kv_bytes()                                # toy: 3 layers x 80, fp32
    assert k["per_token"] == 2 * 3 * 80 * 4 == 1920
    assert k["copied"] == 16 * 8 * 6 * 1920 + 16 * 8 * 4 * 1920
    assert k["shared"] == 16 * 6 * 1920 + 16 * 8 * 4 * 1920
    assert k["saved"] == pytest.approx(7 / 8 * 6 / 10)
    s = claims_systems.prompt_cache_storage()                           # measured storage of the tensors
    assert s["once"] == s["viewed"] == 16 * 6 * 1920 and s["copied"] == 8 * s["once"]


def test_claim_11_every_sample_goes_through_backward():
    assert claims_gradient.backward_rows(N=32, group_sizes=(2, 4, 8, 16, 32)) == \
        {2: 32, 4: 32, 8: 32, 16: 32, 32: 32}


def test_claims_5_and_6_cost_model_figures():
    f = claims_systems.cluster_figures()
    assert f["mem_total_gb"] == pytest.approx(2800) and f["mem_zero3_4_gb"] == pytest.approx(700)
    # the write-up's split: fp32 weights 4 B + fp32 gradients 4 B + fp32 Adam moments 8 B per parameter
    assert (f["weights_fp32_gb"], f["grads_fp32_gb"], f["adam_moments_fp32_gb"]) == (700, 700, 1400)
    assert f["floor_fp32_s"] > 1.2 and f["floor_bf16_s"] > 0.42       # both claimed times are below the floor
    assert f["best_fp32_s"] >= f["floor_fp32_s"]


def test_claim_26_zero_traffic_by_hand():
    z = claims_systems.zero_traffic(ranks=(2, 4))
    assert z[2] == {"ddp": 1.0, "zero12": 1.0, "zero3": 1.5, "zero3_memory": 0.5}
    assert z[4]["ddp"] == 1.5 and z[4]["zero3"] == 2.25 and z[4]["zero3_memory"] == 0.25


def test_claims_28_and_31_arithmetic():
    c = claims_systems.capacity()
    assert c["have_gb"] == 640 and c["need_gb"] == 1200 and c["need_over_have"] == 1.875
    f = claims_systems.flops_vs_peak(1.2e15)
    assert f["A100 SXM"] == pytest.approx(1200 / 312) and f["H100 SXM"] == pytest.approx(1200 / 989)
    fp8 = claims_systems.flops_vs_peak(1.2e15, peaks=claims_systems.GPU_PEAK_FP8)
    assert fp8 == {"H100 SXM": pytest.approx(1200 / 1979)} and fp8["H100 SXM"] < 1   # below the FP8 peak
    assert claims_systems.GPU_PEAK_FP8["H100 SXM"] == \
        pytest.approx(2 * claims_systems.GPU_PEAK_BF16["H100 SXM"], rel=1e-3)
    assert C.CLAIMS[30].verdict == "open"          # under the FP8 peak: arithmetic cannot refute it


def test_claim_35_nvlink_generations():
    assert claims_systems.nvlink("H100 SXM") == {"generation": 4, "gb_s": 900}
    assert claims_systems.nvlink("A100 SXM") == {"generation": 3, "gb_s": 600}
    from grpo_lab.distributed.topology import CLUSTERS
    c = CLUSTERS["dgx_ib"](1)                      # the cost model's H100 node: half of 900 per direction
    assert 1 / c.beta_intra == pytest.approx(900e9 / 2)


def test_claims_6_and_15_byte_arithmetic():
    f = claims_systems.cluster_figures()
    assert f["weights_bf16_gb"] == 350 and f["weights_bf16_gb"] > 320       # above the claimed 320 GB
    assert f["mem_bf16_adam8_zero3_4_gb"] == pytest.approx(6 * 175 / 4)      # 2 + 2 + 1 + 1 B/param over 4


def test_claim_3_against_int64_indices():
    text = claims_live.LIVE["index_int64"]()
    assert "int64" in text and "13.0-13.4x" in text and "11.2x" in text     # 64 / 4.92, 64 / 4.79, 64 / 5.728
    assert "Huffman 4.79-4.92" in C.CLAIMS[2].measured


def test_claim_32_group_mean_gradient_is_the_formula():
    m = claims_gradient.group_mean_gradient()
    assert m["max_diff"] < 1e-12 and m["loss"] == 0.0 and m["grad_norm"] > 0.01
    # a group whose rewards are all equal: zero advantages, so the gradient is 0 as well
    z = claims_gradient.group_mean_gradient(rewards=(1.0, 1.0, 1.0, 1.0))
    assert z["grad_norm"] == 0.0 and z["max_diff"] == 0.0


def test_claim_33_clipped_surrogate_by_hand():
    c = claims_gradient.clipped_surrogate()
    assert c["cases"] == 22 and c["max_diff"] < 1e-12 and c["zero_grad_where_clipped"]
    # a ratio of 1.5 with A > 0 is clipped (no gradient); with A < 0 it is not
    one = claims_gradient.clipped_surrogate(ratios=(1.5,))
    assert one["cases"] == 2 and one["zero_grad_where_clipped"]


def test_claim_30_optimizer_step_sees_no_rewards():
    o = claims_gradient.optimizer_inputs()
    assert o["optimizer_step"] == ["closure"]
    assert o["grpo_loss"] == ["logp", "old_logp", "advantages", "mask"]


def test_claim_29_variance_pieces_by_hand():
    # two draws of a 2-parameter gradient: (1, 0) and (3, 2); mean (2, 1), covariance trace 2 + 2
    g = [torch.tensor([1.0, 0.0], dtype=torch.float64), torch.tensor([3.0, 2.0], dtype=torch.float64)]
    m = claims_gradient._grad_moments(g[0] + g[1], float(g[0] @ g[0] + g[1] @ g[1]), 2)
    assert m["var"] == pytest.approx(4.0) and m["mean_sq"] == pytest.approx(5.0)
    torch.testing.assert_close(claims_gradient.minus_group_mean(torch.tensor([1.0, 0.0, 0.5, 0.5]),
                                                            torch.tensor([0, 0, 1, 1])),
                               torch.tensor([0.5, -0.5, 0.0, 0.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="draws must be >= 2"):
        claims_gradient.baseline_variance(draws=1)


def test_claim_29_baseline_keeps_the_gradient_direction():
    """On real samples (small: 4 prompts, 3 draws) the no-baseline row is its own scale 1, and the
    group mean's mean gradient points the same way (scale > 0)."""
    v = claims_gradient.baseline_variance(seed=0, prompts=4, G=4, draws=3)
    assert set(v) == set(claims_gradient.BASELINES)
    assert v["none"]["scale_vs_none"] == pytest.approx(1.0)
    assert v["group mean"]["scale_vs_none"] > 0 and all(x["var"] > 0 for x in v.values())


def test_claim_2_fp8_error_is_percents():
    g = torch.randn(10_000, generator=torch.Generator().manual_seed(0))
    e = claims_bytes.fp8_errors({"w": g, "zero": torch.zeros(3)})
    assert set(e) == {"w"} and 0.003 < e["w"] < 2 ** -4   # above 0.3%, below the per-value bound


def test_live_table_runs_every_cheap_measurement():
    rows = {r["number"]: r for r in C.table(live=True)}
    assert "5.73 bits" in rows[3]["measured"] or "5.73 bits" in C.CLAIMS[2].measured
    assert "gradient max 0.0" in rows[20]["measured"] and "G=16: 32" in rows[11]["measured"]
    assert len(rows) == 53 and "2 of 4 signs flip" in rows[40]["measured"]
