"""Registries as records: objectives, exchanges, aggregations, policies, shard policies and
codecs carry their capabilities as fields, follow one naming rule, and answer an unknown name
with the one "unknown X 'name'; known: [...]" message."""
import pytest
import torch

from grpo_lab.training.config import check_records, TrainConfig, preset
from grpo_lab.distributed import exchanges, shard_plan, wire
from grpo_lab.distributed.codecs import CODECS
from grpo_lab.algorithm.loss import AGGREGATIONS, grpo_loss, register_aggregation
from grpo_lab.policies.policy import POLICIES
from grpo_lab.registry import lookup
from grpo_lab.training.step import OBJECTIVES, register_objective


def test_lookup_names_the_unknown_value_and_every_known_one():
    with pytest.raises(ValueError, match=r"unknown colour 'teal'; known: \['blue', 'red'\] "
                                         r"\(add one with paint\)"):
        lookup({"red": 1, "blue": 2}, "teal", "colour", "add one with paint")
    assert lookup({"red": 1}, "red", "colour") == 1


def test_objectives_are_records_with_capabilities():
    import grpo_lab.training.ppo  # noqa: F401  (registers "ppo", as building a TrainConfig does)
    assert set(OBJECTIVES) >= {"grpo", "supervised", "ppo"}
    ppo, grpo = OBJECTIVES["ppo"], OBJECTIVES["grpo"]
    assert (grpo.uses_reference, grpo.needs_group, grpo.splits, grpo.critic) == \
        (True, True, True, False)
    assert (ppo.uses_reference, ppo.needs_group, ppo.splits, ppo.critic) == \
        (True, False, False, True)
    assert not OBJECTIVES["supervised"].uses_reference


def _collect(policy, cfg, step, ctx):
    raise NotImplementedError


def _loss(policy, batch, cfg, world=1):
    raise NotImplementedError


def test_register_objective_follows_the_naming_rule():
    try:
        rec = register_objective("test_obj", _collect, _loss, uses_reference=False)
        assert register_objective("test_obj", _collect, _loss, uses_reference=False) == rec
        with pytest.raises(ValueError, match="objective 'test_obj' is already registered"):
            register_objective("test_obj", _collect, _collect)
        with pytest.raises(ValueError, match="without commas"):
            register_objective("a,b", _collect, _loss)
        cfg = preset("quick", objective="test_obj")      # a plugin's objective is a config value
        assert cfg.objective == "test_obj"
    finally:
        OBJECTIVES.pop("test_obj", None)
    with pytest.raises(ValueError, match=r"unknown objective 'test_obj'; known: \[.*'grpo'"):
        check_records(TrainConfig(objective="test_obj"))


def test_exchanges_are_records_and_a_plugin_can_add_one():
    kinds = exchanges.EXCHANGES
    assert [n for n, k in kinds.items() if k.resumes_exactly] == ["allreduce", "sharded", "fsdp2"]
    assert [n for n, k in kinds.items() if k.shards_parameters] == ["fsdp2"]
    assert [n for n, k in kinds.items() if k.overlaps] == ["allreduce", "sharded"]
    assert [n for n, k in kinds.items() if k.reduces_in_backward] == \
        ["ddp_fp16_hook", "ddp_powersgd_hook"]
    assert {n: k.settings for n, k in kinds.items()} == {
        "allreduce": (), "compressed": ("compression",), "ddp_fp16_hook": (),
        "ddp_powersgd_hook": ("powersgd",), "sharded": ("sharding",),
        "sharded_compressed": ("compression", "sharding"), "fsdp2": ("fsdp2",)}
    try:
        exchanges.register_exchange("test_ex", exchanges.make_compressed, ("compression",),
                                    resumes_exactly=False)
        cfg = TrainConfig(exchange={"name": "test_ex"}, compression={"preset": "dgc"})
        exchanges.check_exchange(cfg)                     # it reads the block it declared
        assert cfg.exchange.kind.name == "test_ex" and not cfg.exchange.kind.resumes_exactly
        with pytest.raises(ValueError, match="read by exchange 'compressed' or "
                                             "'sharded_compressed' or 'test_ex', not by 'sharded'"):
            exchanges.check_exchange(TrainConfig(exchange={"name": "sharded"},
                                                 compression={"preset": "dgc"}))
        with pytest.raises(ValueError, match="overlap=True .* 'allreduce' and 'sharded' only"):
            exchanges.check_exchange(TrainConfig(exchange={"name": "test_ex", "overlap": True}))
        with pytest.raises(ValueError, match="exchange 'test_ex' is already registered"):
            exchanges.register_exchange("test_ex", exchanges.make_allreduce)
        with pytest.raises(ValueError, match="unknown settings block 'pigeon'"):
            exchanges.register_exchange("test_ex2", exchanges.make_allreduce, ("pigeon",))
    finally:
        exchanges.EXCHANGES.pop("test_ex", None)


def test_micro_batches_refusals_read_capabilities():
    with pytest.raises(ValueError, match="objective='ppo' .*not normalised by global counts"):
        preset("quick", objective="ppo", micro_batches=2)
    with pytest.raises(ValueError, match="exchange.name='ddp_fp16_hook'"):
        preset("quick", micro_batches=2, exchange={"name": "ddp_fp16_hook"})


def test_aggregations_say_what_their_normaliser_counts():
    assert {n: a.per for n, a in AGGREGATIONS.items()} == \
        {"seq_mean_token_mean": "rows", "token_mean": "tokens", "dr_grpo": "rows"}
    per_tok = torch.tensor([[1.0, 3.0], [2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    assert float(AGGREGATIONS["token_mean"](per_tok, mask, 2)) == 2.0        # (1+3+2)/3
    assert float(AGGREGATIONS["seq_mean_token_mean"](per_tok, mask, 2)) == 2.0  # (2+2)/2
    try:
        register_aggregation("sum_test", lambda p, m, L: (p * m).sum(), per="tokens")
        logp = torch.zeros(2, 2)
        loss, _ = grpo_loss(logp, logp, torch.tensor([1.0, -1.0]), mask, aggregation="sum_test")
        # ratio 1, so per_tok = -A on real tokens: -1 - 1 (row 0, 2 tokens) + 1 (row 1, 1) = -1
        assert float(loss) == -1.0
    finally:
        AGGREGATIONS.pop("sum_test", None)
    with pytest.raises(ValueError, match="per must be 'rows' or 'tokens'"):
        register_aggregation("bad_test", lambda p, m, L: p.sum(), per="prompts")


def test_policy_kinds_and_shard_policies_are_records():
    assert {n: (k.file_based, k.own_autocast) for n, k in POLICIES.items()} == \
        {"toy": (True, True), "hf": (False, False)}
    assert {n for n, p in shard_plan.POLICIES.items() if p.uses_importance} == \
        {"importance_round_robin", "importance_balanced"}
    with pytest.raises(ValueError, match=r"unknown policy 'jax'; known: \['hf', 'toy'\]"):
        check_records(TrainConfig(policy="jax"))


def test_codec_wire_ids_are_the_registry_order():
    # the byte each codec is written as: old messages must keep decoding, so never reorder
    assert wire.CODEC_IDS == tuple(CODECS) == ("raw_int32", "huffman", "rice", "ans", "zstd")


def test_lookup_takes_a_tuple_of_names_too():
    assert lookup(("fp16", "bf16"), "bf16", "format") == "bf16"
    with pytest.raises(ValueError, match=r"unknown format 'fp4'; known: \['bf16', 'fp16'\]$"):
        lookup(("fp16", "bf16"), "fp4", "format")
    with pytest.raises(ValueError, match=r"unknown format \['fp4'\]; known: "):
        lookup({"fp16": 1}, ["fp4"], "format")                  # unhashable: the same message


def _unknown_name_sites():
    """(call with a bad name, kind, bad name, every known name): one per hand-written message
    the package had before lookup answered them all."""
    from grpo_lab.tasks import answers, instruct, rewards
    from grpo_lab.tasks.rewards import resolve_rewards
    from grpo_lab.training import experiments
    from grpo_lab.algorithm import grouping, rollout
    from grpo_lab.policies import engine
    from grpo_lab.distributed import calibrate, compression, fastpath, scaling, topology
    from grpo_lab.teaching.exercises import check_grouper
    from grpo_lab.tasks import Example
    res = experiments.Results([{"strategy": "a", "seed": 0, "history": []}])
    batch = grouping.PromptBatch(["1+2=", "3+4="], ["add", "add"])
    return [
        (lambda: check_records(TrainConfig(sampler={"draw": "gumbel"})), "sampler.draw",
         "gumbel", rollout.DRAWS),
        (lambda: check_records(TrainConfig(speed={"update_forward": "jit"})),
         "speed.update_forward", "jit", engine.UPDATE_FORWARDS),
        (lambda: answers.kind_of("chess"), "instruct task", "chess", answers.TASK_KINDS),
        (lambda: instruct.question(Example("1", "1", "chess")), "instruct task", "chess",
         instruct.QUESTIONS),
        (lambda: calibrate.rel_errors(None, "linear"), "fit", "linear", calibrate.FITS),
        (lambda: compression.dense_encode(torch.zeros(2), "fp4"), "dense format", "fp4",
         compression.HALF_DTYPES),
        (lambda: fastpath.sparsify_(torch.ones(4), None, 2, select="magic"), "selection",
         "magic", fastpath.SELECT),
        (lambda: fastpath.get_fast_codec("ans"), "fast index codec", "ans",
         fastpath.FAST_CODECS),
        (lambda: scaling.exchange_time(topology.CLUSTERS["dgx_ib"](2), "ring", 1e6, "int4"),
         "preset", "int4", scaling.MEASURED_RATIOS),
        (lambda: scaling.study(2, clusters=("moon",)), "cluster", "moon", topology.CLUSTERS),
        (lambda: res.compare("a", "b"), "strategy", "b", ["a"]),
        (lambda: res.compare("a", "a", "speed"), "metric", "speed", experiments.METRICS),
        (lambda: resolve_rewards({"speed": 1.0}),
         "reward function", "speed", rewards.REWARDS),
        (lambda: grouping.kmeans_semantic(batch, 2, embedder="bert"), "embedder", "bert",
         grouping.EMBEDDERS),
        (lambda: check_grouper(lambda b, k, seed=0: None, "mixed"), "check_grouper strategy",
         "mixed", ("by_task", "random", "kmeans_semantic")),
    ]


@pytest.mark.parametrize("i", range(15))
def test_every_unknown_name_gets_the_one_message(i):
    call, kind, bad, known = _unknown_name_sites()[i]
    with pytest.raises(ValueError) as e:
        call()
    assert str(e.value).startswith(f"unknown {kind} {bad!r}; known: {sorted(known)}"), e.value


def test_a_settings_block_under_a_config_fields_name_is_refused_naming_it():
    """A block named "steps" was registered without a word, and every later TrainConfig
    failed ("steps is a settings block"), naming no plugin."""
    import dataclasses as dc
    from grpo_lab.registry import SETTINGS, register_settings
    from grpo_lab.training.config import TrainConfig

    @dc.dataclass
    class Steps:
        n: int = 0
    for name in ("steps", "lr", "hf", "blocks"):
        with pytest.raises(ValueError, match=rf"settings block '{name}' of .*Steps: '{name}' "
                                             rf"is a field of TrainConfig; pick another name"):
            register_settings(name, Steps)
        assert name not in SETTINGS
    assert TrainConfig(steps=3).steps == 3
