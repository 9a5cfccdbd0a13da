"""The 'when does compression pay' calculator (scaling.compression_pays) and its widget."""
import math

import pytest

from grpo_lab.distributed.scaling import (LINKS, MEASURED_CODECS, Codec, Link, compression_pays,
                                          exchange_seconds)


def test_verdict_worked_out_by_hand():
    # n = 4 MB, 2 ranks, no latency, 1 GB/s; ratio 10, 4 GB/s encode and decode (1 ms per 4 MB)
    link, codec = Link(0.0, 1e9), Codec(10.0, 4e9, 4e9)
    v = compression_pays(1e6, link, codec, world=2)
    assert v.plain_s == pytest.approx(4e-3, rel=1e-12)                     # 2 (p-1)/p n / B
    assert v.compressed_s == pytest.approx(1e-3 + 2e-3 + 0.4e-3, rel=1e-12)  # encode + 2 decodes + all-gather
    assert v.pays and v.saving_s == pytest.approx(0.6e-3, rel=1e-9)
    # B* = n (2 (p-1)/p - (p-1)/r) / coding = 4e6 * 0.9 / 3e-3 = 1.2 GB/s
    assert v.break_even_bandwidth == pytest.approx(1.2e9, rel=1e-6)
    assert not compression_pays(1e6, Link(0.0, 1.3e9), codec).pays
    assert compression_pays(1e6, Link(0.0, 1.1e9), codec).pays


def test_overlap_with_backward_moves_the_break_even():
    link, codec = Link(0.0, 1e9), Codec(10.0, 4e9, 4e9)
    v = compression_pays(1e6, link, codec, world=2, overlap=0.5, backward_s=20e-3)
    assert v.plain_s == 0.0 and v.compressed_s == pytest.approx(3e-3) and not v.pays
    # plain exposed 4e6/B - 10 ms beats 3 ms of coding below B = 4e6 / 13 ms
    assert v.break_even_bandwidth == pytest.approx(4e6 / 13e-3, rel=1e-6)


def test_sparse_all_gather_never_pays_when_ratio_is_below_half_the_ranks():
    v = compression_pays(1e6, Link(0.0, 1e6), Codec(10.0, 1e15, 1e15), world=32)
    assert not v.pays and v.break_even_bandwidth == 0.0
    dense = compression_pays(1e6, Link(0.0, 1e6), Codec(2.0, 1e15, 1e15, sparse=False), world=32)
    assert dense.pays and dense.speedup == pytest.approx(2.0, rel=1e-6)    # fp16 sums in flight


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="overlap must be in \\[0, 1\\], got 1.5"):
        compression_pays(1e6, Link(0.0, 1e9), Codec(10.0, 1e9, 1e9), overlap=1.5)
    with pytest.raises(ValueError, match="world >= 2"):
        exchange_seconds(1e6, Link(0.0, 1e9), 1)
    with pytest.raises(ValueError, match="ratio, encode_bps, decode_bps > 0"):
        exchange_seconds(1e6, Link(0.0, 1e9), 2, Codec(0.0, 1e9, 1e9))
    with pytest.raises(ValueError, match="ranks p must be a positive int, got 2.5"):
        exchange_seconds(1e6, Link(0.0, 1e9), 2.5)     # the ring's own check (topology.py)


def test_the_plain_exchange_is_the_ring_formula():
    # 2 (p-1) (alpha + n/p beta): p = 4, n = 4e6 bytes, alpha 1e-5 s, 1e9 B/s -> 6 (1e-5 + 1e-3)
    assert exchange_seconds(1e6, Link(1e-5, 1e9), 4) == pytest.approx(6 * (1e-5 + 1e-3))


def test_cpu_codecs_lose_on_datacentre_links_and_a_gpu_speed_one_wins_on_some():
    cpu = MEASURED_CODECS["fast_topk5, fast path (this CPU)"]
    gpu = MEASURED_CODECS["top-k 46x at 1.5 TB/s (GPU, assumed)"]
    for name in ("100 Gb/s Ethernet", "400 Gb/s InfiniBand", "NVLink 4 (H100)"):
        assert not compression_pays(134.5e6, LINKS[name], cpu, world=8).pays, name
    assert compression_pays(134.5e6, LINKS["400 Gb/s InfiniBand"], gpu, world=8).pays
    assert not compression_pays(134.5e6, LINKS["NVLink 4 (H100)"], gpu, world=8).pays


def test_widget_verdict_flips_with_the_bandwidth():
    from grpo_lab.teaching.widgets.compression_pays import compression_pays_explorer
    box, parts = compression_pays_explorer(plots=False)
    v = parts["state"]["verdict"]
    assert not v.pays and "does NOT pay" in parts["verdict"].value
    parts["bandwidth"].value = 0.9 * v.break_even_bandwidth / 1e9            # just below break-even
    assert parts["state"]["verdict"].pays and "PAYS" in parts["verdict"].value
    parts["link"].value = "NVLink 4 (H100)"                                  # a preset sets the slider
    assert parts["bandwidth"].value == pytest.approx(450.0, rel=0.02)
    assert not parts["state"]["verdict"].pays
    assert math.isfinite(parts["state"]["verdict"].break_even_bandwidth)


def test_a_gloo_calibration_becomes_a_link():
    from grpo_lab.distributed.calibrate import calibrate
    from grpo_lab.distributed.scaling import link_from_calibration
    from grpo_lab.distributed.topology import ring_time
    alpha, bw = 90e-6, 2.5e9                                               # a ring all-reduce, exactly
    sizes = [4 * 2 ** k for k in range(0, 22, 3)]
    measured = {"pingpong": {n: alpha / 2 + n / bw for n in sizes},
                "allreduce": {2: {n: ring_time(2, n, alpha, 1 / bw) for n in sizes}}}
    link = link_from_calibration(calibrate(measured), p=2)
    assert link.alpha == pytest.approx(alpha, rel=1e-6) and link.bandwidth == pytest.approx(bw, rel=1e-6)


def test_widget_draws_its_figure_with_plain_tick_labels(monkeypatch):
    from io import BytesIO

    import grpo_lab.teaching.widgets.compression_pays as M
    figures = []

    def draw(fig):
        fig.savefig(BytesIO(), format="png")
        figures.append(fig)
    monkeypatch.setattr(M, "show_figure", draw)
    box, parts = M.compression_pays_explorer()
    parts["bandwidth"].value = 0.1
    (ax,) = figures[-1].axes
    labels = [t.get_text() for t in ax.get_xticklabels() + ax.get_yticklabels()]
    assert len(figures) == 2 and labels and not any("$" in t for t in labels)   # no mathtext
