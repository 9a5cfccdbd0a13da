"""The alpha-beta cost model, the schedule simulator, METIS placement, value-ordered sends,
the calibration fit and the topology explorer: hand-worked values, tight tolerances, no timing."""

import numpy as np
import pytest

from grpo_lab.distributed import topology as T
from grpo_lab.distributed.calibrate import calibrate, fit, rel_errors
from grpo_lab.distributed.placement import (arrival, latency_graph, metis_groups, naive_groups,
                                            node_groups, planted_latency, same_partition,
                                            time_to_value)

A, B, N = 1.0, 0.01, 400.0           # alpha 1 s, beta 0.01 s/B, n = 400 B: easy by hand


def flat(p):                          # one node of p ranks, every link alpha=A, beta=B
    return T.Cluster(1, p, A, B, A, B)


def test_closed_forms_by_hand():
    assert T.ring_time(4, N, A, B) == pytest.approx(2 * 3 * (1 + 100 * 0.01))           # 12
    assert T.rhd_time(4, N, A, B) == pytest.approx(2 * 2 * 1 + 2 * 0.75 * 400 * 0.01)   # 10
    assert T.tree_time(4, N, A, B) == pytest.approx(2 * 2 * (1 + 4))                    # 20
    assert T.tree_time(5, N, A, B) == pytest.approx(2 * 3 * (1 + 4))                    # ceil(log2 5) = 3
    assert T.dbtree_time(4, N, A, B, chunks=2) == pytest.approx(2 * (2 + 2 - 1) * (1 + 2))   # 18
    assert T.hierarchical_time(2, 2, N, 1, 0.01, 10, 0.1) == pytest.approx(2 * 3 + 2 * 20)  # 46
    assert T.ring_time(1, N, A, B) == 0 and T.total_bytes(4, N) == 2400
    # best chunk count for the double binary tree: k* = sqrt((D-1) n beta / alpha)
    assert T.dbtree_chunks(16, 1e6, 1.0, 1e-5) in (5, 6)            # sqrt(3 * 10) = 5.48


def test_ring_phases_by_hand():
    ph = T.ring_schedule(4, N)
    assert len(ph) == 6                                               # 2 (p-1) steps
    assert list(zip(ph[0].src, ph[0].dst)) == [(0, 1), (1, 2), (2, 3), (3, 0)]
    assert set(ph[0].nbytes) == {100.0}                               # n / p per message
    r = T.simulate(ph, flat(4))
    assert list(r.sent) == [600.0] * 4                                # 2 (p-1)/p n per rank
    assert r.time == pytest.approx(12.0) and r.inter_node_bytes == 0


def test_halving_doubling_phases_by_hand():
    ph = T.rhd_schedule(4, N)
    assert [p.label for p in ph] == ["halving distance 1", "halving distance 2",
                                     "doubling distance 2", "doubling distance 1"]
    assert [p.nbytes[0] for p in ph] == [200, 100, 100, 200]
    assert list(zip(ph[1].src, ph[1].dst)) == [(0, 2), (1, 3), (2, 0), (3, 1)]


def test_binomial_tree_phases_by_hand():
    ph = T.tree_schedule(5, N)
    pairs = [list(zip(p.src.tolist(), p.dst.tolist())) for p in ph]
    assert pairs[:3] == [[(1, 0), (3, 2)], [(2, 0)], [(4, 0)]]       # reduce to rank 0
    assert pairs[3:] == [[(0, 4)], [(0, 2)], [(0, 1), (2, 3)]]       # broadcast, mirrored


@pytest.mark.parametrize("p", [2, 3, 4, 5, 8, 13, 16])
def test_simulated_bytes_equal_the_formula(p):
    for name in T.SCHEDULES:
        if T.SCHEDULES[name].power_of_two and p & (p - 1):
            continue
        kw = {"groups": [list(range(p))]} if name == "hierarchical" else {}
        r = T.simulate(T.SCHEDULES[name](p, N, chunks=3, **kw), flat(p))
        assert r.total_bytes == pytest.approx(T.total_bytes(p, N), rel=1e-12), name


@pytest.mark.parametrize("nodes,g", [(4, 4), (2, 8), (8, 2), (1, 8), (4, 1)])
def test_simulation_equals_closed_forms_on_two_level_clusters(nodes, g):
    c = T.Cluster(nodes, g, 1e-6, 1e-9, 5e-6, 2e-8)
    n = 3.2e6
    for name in ("ring", "rhd", "tree", "hierarchical"):
        r = T.simulate(T.schedule(name, c, n), c)
        assert r.time == pytest.approx(T.closed_form(name, c, n), rel=1e-12), name
        assert r.total_bytes == pytest.approx(T.total_bytes(c.size, n), rel=1e-12), name
    # between nodes: hierarchical and halving-doubling (low bits first) send 2 (M-1) n / (gM) per rank
    for name in ("hierarchical", "rhd"):
        r = T.simulate(T.schedule(name, c, n), c)
        assert r.inter_node_bytes == pytest.approx(c.size * 2 * (nodes - 1) * n / (g * nodes), rel=1e-12)


def test_double_binary_tree_is_the_bound_and_exact_when_a_rank_has_two_children_each_step():
    for p in (3, 13):
        for k in (1, 2, 5):
            r = T.simulate(T.dbtree_schedule(p, N, chunks=k), flat(p))
            assert r.time == pytest.approx(T.dbtree_time(p, N, A, B, chunks=k), rel=1e-12)
    for p in (2, 4, 8, 16):
        r = T.simulate(T.dbtree_schedule(p, N, chunks=2), flat(p))
        assert r.time <= T.dbtree_time(p, N, A, B, chunks=2) + 1e-12
    # each rank is an inner node in at most one tree when p is even (heap tree and its mirror)
    p = 8
    inner1 = {(i - 1) // 2 for i in range(1, p)}
    inner2 = {p - 1 - (i - 1) // 2 for i in range(1, p)}
    assert not inner1 & inner2


def test_latency_matrix_and_capacity_enter_the_links():
    L = np.full((4, 4), 3.0)
    np.fill_diagonal(L, 0)
    c = T.Cluster(2, 2, 1.0, 0.01, 2.0, 0.1, latency=L, capacity=(1.0, 0.5))
    alpha, beta = c.links()
    assert alpha[0, 1] == 3.0 and beta[0, 1] == 0.01                  # same node: intra beta
    assert beta[0, 2] == pytest.approx(0.2)                           # slower end: 0.1 / 0.5
    r = T.simulate(T.ring_schedule(4, N), c)                          # each step: 3 + 100 * 0.2
    assert r.time == pytest.approx(6 * 23.0)


def test_bad_inputs_name_the_value():
    with pytest.raises(ValueError, match="nodes must be a positive int, got 0"):
        T.Cluster(0, 8, 1, 1, 1, 1)
    with pytest.raises(ValueError, match="beta_inter must be >= 0.*-1"):
        T.Cluster(1, 8, 1, 1, 1, -1)
    with pytest.raises(ValueError, match=r"latency must be \(4, 4\).*\(3, 3\)"):
        T.Cluster(2, 2, 1, 1, 1, 1, latency=np.zeros((3, 3)))
    with pytest.raises(ValueError, match="p a power of 2, got p=6"):
        T.rhd_time(6, N, A, B)
    with pytest.raises(ValueError, match="unknown schedule 'mesh'"):
        T.schedule("mesh", flat(4), N)
    with pytest.raises(ValueError, match="message size n must be >= 0 bytes, got -5"):
        T.ring_time(4, -5, A, B)
    with pytest.raises(ValueError, match="use simulate"):
        T.closed_form("ring", T.Cluster(1, 2, 1, 1, 1, 1, capacity=(0.5,)), N)
    with pytest.raises(ValueError, match="n_groups must be a positive int dividing 8 ranks, got 3"):
        metis_groups(np.ones((8, 8)), 3)
    for latency, said in ((np.zeros((1, 1)), r"at least 2 ranks, got shape \(1, 1\)"),
                          (np.array([[0, np.nan], [np.nan, 0]]), "finite and > 0, got nan"),
                          (np.array([[0, 1], [np.inf, 0]]), "finite and > 0, got inf"),
                          (np.array([[0, -1], [-1, 0]]), "finite and > 0, got -1")):
        with pytest.raises(ValueError, match=said):
            latency_graph(latency)                      # never a weight made of NaN
    with pytest.raises(ValueError, match="unknown order 'random'"):
        arrival([1], [1], "random", lambda b: b)
    with pytest.raises(ValueError, match="share f must be in"):
        time_to_value(np.array([1.0]), np.array([1.0]), 0.0)


def test_metis_recovers_planted_nodes():
    for nodes, g, seed in ((4, 4, 0), (8, 4, 1), (16, 8, 2)):
        L, node_of = planted_latency(nodes, g, seed=seed)
        truth = node_groups(node_of)
        assert same_partition(metis_groups(L, nodes), truth)
        assert not same_partition(naive_groups(nodes * g, g), truth)  # ranks are scattered
        c = T.Cluster(nodes, g, 2e-6, 1e-9, 20e-6, 1e-8, latency=L, node_of=tuple(node_of))
        t = {k: T.simulate(T.schedule("hierarchical", c, 1e6, groups=grp), c).time
             for k, grp in (("naive", naive_groups(nodes * g, g)), ("metis", metis_groups(L, nodes)))}
        assert t["metis"] < t["naive"]


def test_value_ordered_sends_change_when_not_how_much():
    nbytes, scores = [100, 100, 100], [1.0, 2.0, 7.0]
    step = lambda b: 1 + 0.01 * b                                     # 2 s per bucket
    t, share = arrival(nbytes, scores, "model", step)
    assert list(t) == [2, 4, 6] and share == pytest.approx([0.1, 0.3, 1.0])
    tv, sv = arrival(nbytes, scores, "value", step)
    assert sv == pytest.approx([0.7, 0.9, 1.0])
    assert time_to_value(t, share, 0.5) == 6 and time_to_value(tv, sv, 0.5) == 2
    assert t[-1] == tv[-1]                                            # same total time


def test_fit_recovers_alpha_beta_from_exact_ring_times():
    alpha, beta = 5e-5, 3e-10
    measured = {"pingpong": {n: alpha + n * beta for n in (4, 4096, 4 << 20)},
                "allreduce": {p: {n: T.ring_time(p, n, alpha, beta) for n in (4, 4096, 4 << 20)}
                              for p in (2, 3, 4)}}
    cal = calibrate(measured)
    for name in ("pingpong", "allreduce", "allreduce p=3"):
        assert cal.fits[name] == pytest.approx((alpha, beta), rel=1e-9)
    assert rel_errors(cal).max() < 1e-9 and len(rel_errors(cal, p=2)) == 3
    assert fit([1, 1], [0, 10], [1, 2]) == pytest.approx((1.0, 0.1))


def test_explorer_controls_drive_the_data():
    from grpo_lab.teaching.widgets.topology import topology_explorer
    box, parts = topology_explorer(plots=False)
    d = parts["data"]
    assert d["cluster"].size == 16 and parts["phase"].max == 29      # ring: 2 (16-1) phases
    assert d["sim"].time == pytest.approx(d["closed_form_s"], rel=1e-12)
    parts["schedule"].value = "hierarchical"
    assert parts["phase"].max == 2 * 3 + 2 * 3 - 1                    # 2(g-1) + 2(M-1) phases
    parts["phase"].value = 6                                          # first inter-node phase
    assert d["phase"] == 6 and len(d["transfers"]) == 16
    assert all(s // 4 != t // 4 for s, t, _ in d["transfers"])
    parts["nodes"].value = 2
    assert d["cluster"].size == 8 and parts["phase"].max == 2 * 3 + 2 * 1 - 1


def test_explorer_renders_png():
    from grpo_lab.teaching.widgets.topology import topology_explorer
    box, parts = topology_explorer()
    assert parts["phase_image"].value[:4] == b"\x89PNG" and parts["curve_image"].value[:4] == b"\x89PNG"
    before = parts["phase_image"].value
    parts["phase"].value = 20
    assert parts["phase_image"].value != before
    parts["schedule"].value = "rhd"
    parts["gpus"].value = 2
    parts["nodes"].value = 1                                          # 2 ranks: still a power of 2
    assert "error" not in parts["data"]


def test_scaling_arithmetic_by_hand():
    from grpo_lab.distributed import scaling as S
    assert S.allgather_time(4, 100, 1.0, 0.01) == pytest.approx(3 * 2)
    assert S.zero_memory(175e9, 1, 0) == pytest.approx(2800e9)       # 16 B/param: "FP32 2800 GB"
    assert S.zero_memory(175e9, 4, 3) == pytest.approx(700e9)        # ZeRO-3 over 4 GPUs
    assert S.zero_memory(175e9, 1024, 3, extra_bytes_per_param=4) == pytest.approx(175e9 * (16 / 1024 + 4))
    assert S.compute_time(1e9, 1e3, 2, 1e12, 0.5) == pytest.approx(6.0)
    c = T.Cluster(4, 1, 1.0, 0.01, 1.0, 0.01)                         # 4 ranks, uniform links
    params = 100                                                     # 400 B of fp32 gradient
    assert S.exchange_time(c, "ring", params, "fp32") == pytest.approx(T.ring_time(4, 400, 1, 0.01))
    assert S.exchange_time(c, "ring", params, "fp16") == pytest.approx(T.ring_time(4, 200, 1, 0.01))
    assert S.exchange_time(c, "ring", params, "fp8_topk5") == pytest.approx(3 * (1 + 400 / 10.1 * 0.01))
    assert S.bandwidth_floor(T.Cluster(2, 8, 0, 0, 0, 1e-9), 1e9) == pytest.approx(2 * 0.5 * 4e9 * 1e-9 / 8)
    with pytest.raises(ValueError, match="unknown preset 'int4'"):
        S.exchange_time(c, "ring", params, "int4")
    with pytest.raises(ValueError, match="stage must be 0..3 and N >= 1, got stage=4"):
        S.zero_memory(1, 1, 4)


def test_schedules_are_records_and_their_closed_forms_keep_the_hand_worked_values():
    # what each takes is on its record, not in an if-ladder on the name
    caps = {name: (s.takes_chunks, s.node_layout, s.power_of_two) for name, s in T.SCHEDULES.items()}
    assert caps == {"ring": (False, False, False), "rhd": (False, False, True),
                    "tree": (False, False, False), "dbtree": (True, False, False),
                    "hierarchical": (False, True, False)}
    # 4 nodes x 4 ranks, n = 3.2 MB: the values the if-ladder gave, worked by hand
    c, n = T.Cluster(4, 4, 1e-6, 1e-9, 5e-6, 2e-8), 3.2e6
    by_hand = {"ring": 30 * (5e-6 + n / 16 * 2e-8),
               "rhd": 4 * 1e-6 + 1.5 * n * 1e-9 + 4 * 5e-6 + 1.5 * n / 4 * 2e-8,
               "tree": 4 * (1e-6 + n * 1e-9) + 4 * (5e-6 + n * 2e-8),
               "dbtree": 2 * (3 + 4 - 1) * (5e-6 + n * 2e-8 / 3),           # chunks=3, D=4
               "hierarchical": 6 * (1e-6 + n / 4 * 1e-9) + 6 * (5e-6 + n / 16 * 2e-8)}
    for name, t in by_hand.items():
        assert T.closed_form(name, c, n, chunks=3) == pytest.approx(t, rel=1e-12), name
    # one node: the flat forms, the inside links everywhere
    assert T.closed_form("ring", T.Cluster(1, 4, A, B, 9, 9), N) == pytest.approx(12.0)
    assert T.closed_form("rhd", T.Cluster(1, 4, A, B, 9, 9), N) == pytest.approx(4 + 1.5 * 4)
    # a schedule record builds its phases when called, as the plain function does
    assert [p.label for p in T.SCHEDULES["ring"](4, N)] == [p.label for p in T.ring_schedule(4, N)]


def test_an_unknown_schedule_is_refused_by_the_one_lookup_everywhere():
    from grpo_lab.distributed import scaling as S
    msg = r"unknown schedule 'mesh'; known: \['dbtree', 'hierarchical', 'rhd', 'ring', 'tree'\]"
    with pytest.raises(ValueError, match=msg):
        T.closed_form("mesh", flat(4), N)
    with pytest.raises(ValueError, match=msg):
        T.schedule("mesh", flat(4), N)
    with pytest.raises(ValueError, match=msg):                       # the simulated path
        S.exchange_time(T.CLUSTERS["hetero"](2), "mesh", 1e6, "fp32")


def test_a_registered_schedule_is_simulated_and_timed_like_the_built_in_ones():
    def star(P, n, **_):                     # everyone to rank 0, then rank 0 to everyone
        return [T._phase([(r, 0) for r in range(1, P)], n, "gather"),
                T._phase([(0, r) for r in range(1, P)], n, "scatter")]
    T.register_schedule("star_test", star, lambda L, n, chunks=None: 2 * (L.ai + (L.P - 1) * n * L.bi))
    try:
        c = flat(4)
        assert T.simulate(T.schedule("star_test", c, N), c).time == pytest.approx(2 * (1 + 3 * 4))
        assert T.closed_form("star_test", c, N) == pytest.approx(2 * (1 + 3 * 4))
    finally:
        del T.SCHEDULES["star_test"]


def test_ring_drawing_keeps_every_rank_label_inside_the_axes():
    """16 ranks: the labels of ranks 0, 4, 8 and 12 sit beyond the ring's extremes (radius 1.12);
    an annotation whose point is outside the axes' limits is not drawn at all, so every label's
    point must lie inside them, and its box inside the figure."""
    from grpo_lab.teaching.widgets.topology import _phase_figure, explorer_cluster
    c = explorer_cluster(4, 4, 5.0, 50.0)
    fig = _phase_figure(c, T.schedule("ring", c, 1e6)[0])
    ax = fig.axes[0]
    labels = [t for t in ax.texts if t.get_text().isdigit()]
    assert sorted(int(t.get_text()) for t in labels) == list(range(16))
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    r = FigureCanvasAgg(fig).get_renderer()
    fig.draw(r)
    box = fig.bbox
    for t in labels:
        b = t.get_window_extent(r)
        assert box.x0 <= b.x0 and b.x1 <= box.x1 and box.y0 <= b.y0 and b.y1 <= box.y1, t.get_text()
        (x0, x1), (y0, y1), (x, y) = ax.get_xlim(), ax.get_ylim(), t.xy
        assert x0 <= x <= x1 and y0 <= y <= y1, t.get_text()   # else matplotlib skips the label
