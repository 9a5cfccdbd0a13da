"""Configs: one dataclass per concern, a docstring under each field.

The docstrings are the documentation: ``grpo-lab train --help`` prints them (the CLI is
generated from these classes by ``cli.py``) and notebooks build the same objects.
``TrainConfig`` holds its gradient exchange as a typed sub-config
(``exchanges.ExchangeConfig``: ``cfg.exchange.name``, ``--exchange.name`` on the command
line; each exchange kind's own fields are settings blocks, ``--compression.preset``); a
plain dict is turned into one when the config is built, so presets and saved configs (JSON)
round-trip. Presets give sizes for scale: ``tiny_cpu`` (the default demo, tuned for time to accuracy),
``defaults`` (the field defaults as they are),
``quick`` (tests and notebooks in CI), ``mixture_cpu``, ``hf_tiny_cpu`` (a transformers
model on the CPU), ``smollm_cpu`` (SmolLM2-135M-Instruct on a laptop CPU), ``hf_gpu`` (a real
model on GPUs).
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from grpo_lab.algorithm import group_config  # noqa: F401 (the grouping block, cfg.group)
from grpo_lab.distributed.exchange_config import ExchangeConfig
from grpo_lab.registry import (CONFIG_FIELDS, check_number, check_types, fields_finite,
                               fields_nonnegative, fields_positive, load_plugins, lookup)
from grpo_lab.tasks import MIXTURE_TASKS
from grpo_lab.training import dynamic_config  # noqa: F401 (DAPO's block, cfg.dynamic)
from grpo_lab.training.ppo_config import PPOConfig
from grpo_lab.training.saved_config import upgrade_saved
from grpo_lab.training.speed_config import SpeedConfig

if TYPE_CHECKING:
    from grpo_lab.policies.hf_config import HFConfig

# Importing this module loads the registry, the task list and the torch-free sub-configs;
# building a config loads HFConfig and the settings blocks' classes, not the records that
# check them (check_records imports those).


def _hf_config(**fields) -> HFConfig:
    from grpo_lab.policies.hf_config import HFConfig
    return HFConfig(**fields)


def _block(name: str, cls: type, value):
    """A settings block from what was given: None (its defaults), a dict of its fields or the
    dataclass itself (copied: a config owns its blocks)."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return dataclasses.replace(value)
    if not isinstance(value, dict):
        raise ValueError(f"{name} is a settings block: give it as a dict of its fields or "
                         f"as {cls.__name__}(...), got {value!r}")
    known = [f.name for f in dataclasses.fields(cls)]
    for k in value:
        if k not in known:
            raise ValueError(f"unknown field {name}.{k}{renamed_hint(f'{name}.{k}')}; "
                             f"{name}'s fields: {known}")
    return cls(**value)


def renamed_hint(name: str) -> str:
    """The settings-block field a flat name stands for (" (now 'tis.cap')", "policy_loss":
    'loss.policy'), or the sub-config field it names exactly ("fast_path": 'speed.fast_path';
    "exchange.powersgd_rank": 'powersgd.rank'), or ""."""
    import difflib
    from grpo_lab.registry import SETTINGS
    name = name.removeprefix("exchange.")        # its kinds' fields moved to their blocks
    dotted = [f"{b}.{f.name}" for b, cls in SETTINGS.items() for f in dataclasses.fields(cls)]
    subs = [f"{s.name}.{f.name}" for s in dataclasses.fields(TrainConfig) if s.name in SUB_CONFIGS
            for f in dataclasses.fields(s.default_factory())]
    exact = [d for d in dotted + subs if name in (d.split(".")[1], d.replace(".", "_"),
                                                  "_".join(d.split(".")[::-1]))]
    near = exact or difflib.get_close_matches(name, dotted, n=1, cutoff=0.7)
    return f" (a settings block's field now: {near[0]!r})" if near else ""


CONFIG_FILE = "config.json"
"""out_dir/config.json: the run's resolved config (``to_dict``), what ``--config`` reads back."""

# finite is not enough: values past these wreck a run in a few steps, then fail far away
# ("logp is nan") without naming the cause
CEILINGS = {"lr": 1.0, "ppo.vf_lr": 1.0, "weight_decay": 1.0}
CEILING_WHY = {
    "lr": "AdamW moves every weight by about lr per step (typical: 1e-6 for a pretrained LM, "
          "1e-4 to 1e-3 for the toy policy)",
    "ppo.vf_lr": "AdamW moves every critic weight by about ppo.vf_lr per step",
    "weight_decay": "AdamW multiplies each weight by (1 - lr * weight_decay) per step "
                    "(typical: 0 to 0.1)"}


@dataclass
class TrainConfig:
    plugins: str = ""
    """Modules (names or .py paths, comma-separated) imported before the config is checked:
    their register_grouper / register_task / register_reward / register_advantage calls
    add what this run uses (grpo-lab train --plugin my_module)."""
    objective: str = "grpo"
    """"grpo"; or "supervised": cross-entropy on task demonstrations (answers only), as the
    base policy was made, through the same loop (the compression benchmarks' control); or
    "ppo": PPO with a learned critic (ppo.py; ppo.critic: a value head on the policy's hidden
    states, or a critic network of its own), GAE advantages instead of the group baseline
    (toy policy, one process, by_prompt)."""
    task: str = "addition"
    """Task to train and evaluate on: one of tasks.TASKS, several joined by commas
    ("count,compare"), or "mixture" (the families of tasks.MIXTURE_TASKS). With several,
    prompts are drawn uniformly over them and eval/accuracy/<task> is logged per task."""
    base_checkpoint: str = "data/base_policy.safetensors"
    """Policy to start from; also the frozen reference policy for the KL term. With
    policy="hf": a folder holding a transformers model and its tokenizer, or a hub id
    (downloaded by transformers on your machine; nothing here ever downloads)."""
    policy: str = "toy"
    """"toy": the char-level GPT (model.py); "hf": any transformers causal LM with its
    tokenizer (hf.py; pip install -e ".[hf]"). Both go through policy.py's interface."""
    answer_format: str = "raw"
    """How prompts ask for the answer. "raw": the toy's own format ("12+34=" -> "46<eos>",
    exact-match rewards). For instruct models (policy="hf", hf.chat_template): each task
    asked in words (instruct.py) with "tags" (<answer>42</answer>), "boxed" (\\boxed{42}) or
    "number" (the number alone); accuracy then reads the answer whatever wraps it (tags,
    boxed, last number) and the format reward checks the requested format (answers.py).
    With max_new_tokens=0 an instruct format gets 64 new tokens."""
    system_prompt: str = ""
    """policy="hf" with hf.chat_template: a system turn before each prompt ("": the chat
    template's own default, if it has one)."""
    hf: HFConfig = field(default_factory=_hf_config)
    """policy="hf": dtype, autocast, chat template, remote code, gradient checkpointing,
    sampling dtype and LoRA of the transformers model (see hf.HFConfig; --hf.dtype on the
    command line)."""
    rollout: str = "grpo_lab"
    """Who samples the training rollout (rollout.ROLLOUTS): "grpo_lab" (rollout.sample) or
    "vllm" (vLLM in this process, the policy's weights pushed into it after each update; its
    log-probs are the sampler's, the trainer recomputes its own: needs tis.cap > 0, policy="hf",
    one process, and vLLM in its own environment, bench/bench_vllm.py --build_env DIR).
    Evaluation always runs grpo_lab's sampler. Its settings: the ``sampler`` block
    (rollout.Sampler: ``--sampler.draw``); the training forward is ``speed.update_forward``."""
    out_dir: str = "runs/demo"
    """Folder for metrics.jsonl, checkpoint.safetensors, config.json (the run's resolved
    config: --config out_dir/config.json runs it again), report.png and report.md."""
    report_to: str = "none"
    """Live logging of every step's metrics and the evaluation samples (trackers.py):
    "tensorboard" (out_dir/tensorboard), "wandb" (offline, out_dir/wandb, unless WANDB_MODE
    is set), "trackio" (its local database), several joined by commas, or "none". Each needs
    its package: pip install tensorboard (a checkout: pip install -e ".[tensorboard]"). A
    tracker that fails mid-run is warned about once and dropped; training and metrics.jsonl
    go on."""
    steps: int = 3000
    """Number of GRPO steps (each: one rollout, mu policy updates)."""
    time_budget_s: float = 300.0
    """Stop after this many seconds of training (0 = no limit); the last step finishes."""
    user_code_timeout_s: float = 30.0
    """Longest one call of a reward, grouper, estimator or task generator may run (seconds;
    0 = no limit): past it the run stops with a one-line error naming the function and where
    it was (timelimit.py), every rank with it, and the last checkpoint stays as it was."""
    target_accuracy: float = 0.0
    """Stop at the first evaluation whose held-out accuracy reaches this (0 = run all steps):
    time to accuracy. The report says which ended the run: steps, target or budget."""
    train_pool: int = 0
    """Draw training prompts from a fixed pool of this many (a finite training set, as
    GSM8K is); 0 = fresh prompts from the task's generator every step."""
    prompts_per_step: int = 16
    """B: prompts sampled per step."""
    group_size: int = 8
    """G: completions sampled per prompt (GRPO needs G >= 2)."""
    max_new_tokens: int = 0
    """Longest completion; 0 = the task's longest answer + 2."""
    temperature: float = 0.7
    """Sampling temperature; the loss scores tokens at the same temperature (0.7 wastes
    fewer samples on garbage than 1.0 for a partly trained policy)."""
    top_k: int = 0
    """Sample only from the k most likely tokens (0 = off)."""
    top_p: float = 1.0
    """Nucleus sampling (Holtzman et al. 2020): sample only from the most likely tokens whose
    probability adds up to top_p (1.0 = off, the sampler unchanged bit for bit). The loss
    still scores tokens under the untruncated policy, as with top_k."""
    lr: float = 1e-4
    """AdamW learning rate (3e-4 and up made held-out accuracy fall on the toy policy; at
    most 1, config.CEILINGS)."""
    warmup_steps: int = 20
    """Linear learning-rate warm-up from 0 over this many steps (Adam's first steps on a
    pretrained policy are otherwise a shock)."""
    lr_schedule: str = "cosine"
    """"constant", or "cosine": decay to 10% of lr over `steps` (after the warm-up)."""
    schedule_steps: int = 0
    """Length of the cosine decay when it is not `steps` (0: `steps`): a run that stops on
    purpose before its schedule ends, as the pretraining warm-up does (1800 of 2000 steps)."""
    weight_decay: float = 0.0
    """AdamW weight decay (at most 1, config.CEILINGS)."""
    adam_eps: float = 1e-8
    """AdamW eps."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this (0 = off)."""
    mu: int = 1
    """Policy updates per rollout (DeepSeekMath's mu); old log-probs come from the rollout."""
    method: str = ""
    """A named method as its paper defines it (one of methods.METHODS: "grpo", "dr_grpo",
    "dapo", "gspo", "cispo", "reinforce_pp_baseline"): sets the fields that paper sets; a
    field given another non-default value is an error. "" = the fields as they are."""
    advantage: str = "grpo"
    """Group-relative advantage estimator (one of advantages.ADVANTAGES)."""
    supervision: str = "outcome"
    """"outcome": one reward per completion, its advantage on every token (DeepSeekMath
    4.1.2); "process": a reward per answer character (rewards.step_rewards), advantages
    from advantages.process_advantages (4.1.3)."""
    reward_weights: dict = field(default_factory=lambda: {"accuracy": 1.0, "partial": 0.5,
                                                          "format": 0.1})
    """Weights of the reward functions, as name=weight pairs (names from rewards.REWARDS)."""
    eval_every: int = 100
    """Evaluate greedy accuracy on the held-out set every this many steps (0 = only at the ends)."""
    eval_size: int = 200
    """How many held-out examples to evaluate on per task (from data/eval_<task>.jsonl; at
    most the set's size); 0 = no evaluation."""
    ckpt_every: int = 250
    """Write the checkpoint every this many steps (and at the end)."""
    ckpt_format: str = "single"
    """How checkpoints are written: "single" (one safetensors file, every tensor whole,
    written by rank 0) or "dcp" (torch.distributed.checkpoint: each rank writes its own shards,
    none gathers the whole state; distributed/dcp.py). A field, not a rule tied to the
    exchange: "single" stays the default on any number of ranks (one file to copy, read by
    every tool), "dcp" is for runs whose whole state does not fit one rank. Either kind
    resumes on any number of ranks; a resume reads whichever kind the folder holds, so this
    is a runtime field. "dcp" needs an exchange that steps torch's AdamW (all but the
    sharder's)."""
    seed: int = 0
    """Seed of prompt draws and sampling; step s uses seeds derived from (seed, s)."""
    threads: int = 0
    """torch CPU threads (0 = the cores other processes leave free: CPU count minus the load
    average, at least 1; trainer.free_cores; with speed.async_steps, minus the sampler
    thread's)."""
    speed: SpeedConfig = field(default_factory=SpeedConfig)
    """Where the run trains and how fast, not what it computes: the fast-path probe, the
    rollout's threads, the device (see speed_config.SpeedConfig; --speed.fast_path probe)."""
    # ---- grouping (grouping.py): which completions share a baseline
    grouping: str = "by_prompt"
    """Grouper: a name in grouping.GROUPERS (register your own with register_grouper, or pass
    the function or record itself from Python); "by_prompt" is canonical GRPO. Its settings:
    the ``group`` block (group_config.Group: ``--group.k 3``) and the grouper's own, if any."""
    # ---- PPO with a critic (objective="ppo", ppo.py)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    """objective="ppo": the critic and GAE (see ppo.PPOConfig; --ppo.gamma on the command line)."""
    # ---- memory levers (issue 14; memory.py measures them, bench/bench_memory.py)
    checkpoint_every: int = 0
    """Activation checkpointing of the training forward: block i keeps only its input and
    recomputes its activations in backward when i % k == 0 (1: every block; 0: off). Same
    gradients, less activation memory, one more forward of those blocks. policy="hf":
    transformers' every_n_layers, the same rule (hf.gradient_checkpointing is k = 1)."""
    micro_batches: int = 1
    """Gradient accumulation: the step's prompts split into this many micro-batches (whole
    prompts), objective and backward on each; their losses keep the global batch's
    normaliser, so the gradients add up to the whole batch's. At most prompts_per_step; not
    with objective="ppo", the DDP exchanges or exchange.overlap (they reduce during backward)."""
    autocast: bool = False
    """Toy policy: bf16 autocast of the training forward (mixed precision: weights, AdamW,
    sampling, the reference and evaluation stay float32; log-probs are taken in float32).
    policy="hf" has hf.autocast (every forward) instead."""
    # ---- data parallel (distributed/exchanges.py): N processes, one global batch
    exchange: ExchangeConfig = field(default_factory=ExchangeConfig)
    """How the ranks of a data-parallel run average gradients (see exchanges.ExchangeConfig)."""
    blocks: dict = field(default_factory=dict)
    """The settings blocks of the records (registry.SETTINGS: ``group``, ``dynamic``, ``loss``,
    ``clip``, ``kl``, ``tis``, ``overlong``, a plugin variant's or grouper's), each read as
    ``cfg.<name>`` and given by its name: ``TrainConfig(tis={"cap": 2})``, ``--tis.cap 2``,
    ``{"tis": {"cap": 2}}``."""

    def __init__(self, **given):
        """The fields by name; a settings block by its name, as its dataclass or a dict of its
        fields (every block not given: its defaults)."""
        from grpo_lab.algorithm import variants  # noqa: F401 (the built-in blocks register)
        from grpo_lab.registry import SETTINGS
        given.pop("_checked", None)      # check_records' mark, carried by vars(cfg): not copied
        blocks = {**given.pop("blocks", {}),
                  **{n: given.pop(n) for n in list(given) if n in SETTINGS}}
        for f in dataclasses.fields(self):
            if f.name != "blocks":
                setattr(self, f.name, given.pop(f.name) if f.name in given else f.default
                        if f.default is not dataclasses.MISSING else f.default_factory())
        if given:
            raise TypeError(f"TrainConfig got an unexpected keyword argument "
                            f"{next(iter(given))!r}{renamed_hint(next(iter(given)))}")
        self.blocks = {n: _block(n, cls, blocks.get(n)) for n, cls in SETTINGS.items()}
        if unknown := [n for n in blocks if n not in self.blocks]:      # the first given
            raise TypeError(f"TrainConfig got an unknown settings block {unknown[0]!r}")
        self.__dict__.update(self.blocks)         # cfg.tis: the block itself
        self.__post_init__()

    @property
    def task_names(self) -> list[str]:
        """The task names ``task`` stands for ("mixture" -> MIXTURE_TASKS)."""
        return list(MIXTURE_TASKS) if self.task == "mixture" else self.task.split(",")

    def check_world(self, world: int) -> None:
        """Refuse more processes than prompts per step: each rank samples at least one."""
        if self.prompts_per_step < world:
            raise ValueError(f"prompts_per_step={self.prompts_per_step} is fewer than the "
                             f"{world} processes: each rank needs at least one prompt")

    def __post_init__(self):
        """The config's own fields; the records it names check it in ``check_records``. No
        side effects here: plugins are imported by preset(), from_dict(), the CLI and the
        trainer's setup before a config naming what they register is built."""
        from grpo_lab.algorithm.methods import apply_method
        from grpo_lab.policies.hf_config import HFConfig
        for name, cls in (("exchange", ExchangeConfig), ("ppo", PPOConfig), ("hf", HFConfig),
                          ("speed", SpeedConfig)):                    # a dict of its fields
            if not isinstance(getattr(self, name), cls):
                setattr(self, name, _block(name, cls, getattr(self, name)))
        if callable(self.grouping):                  # registering is preset()'s, not ours
            raise ValueError(f"grouping={self.grouping!r}: a config holds a grouper's name; "
                             f"pass the function or record to config.preset(...), which "
                             f"registers it, or register it (grouping.register_grouper) first")
        check_types(self)                  # each field of its kind: "no" is not False
        for name in (*SUB_CONFIGS, *self.blocks):
            check_types(getattr(self, name), f"{name}.")
        if not self.out_dir.strip():
            raise ValueError("out_dir is empty: name the run's folder (a run writes config.json, "
                             "metrics.jsonl and its checkpoint there, replacing a former run's)")
        if not self.base_checkpoint.strip():
            raise ValueError("base_checkpoint is empty: name the policy to start from (a "
                             ".safetensors file, a model folder or a name `grpo-lab model list` "
                             "shows)")
        apply_method(self)
        if not self.adam_eps > 0:
            raise ValueError(f"adam_eps must be > 0, got {self.adam_eps}")
        fields_finite(self, "lr", "temperature", "target_accuracy", "weight_decay", "adam_eps",
                "grad_clip", "time_budget_s", "user_code_timeout_s")
        fields_positive(self, "steps", "prompts_per_step", "mu", "ckpt_every")
        fields_nonnegative(self, "time_budget_s", "warmup_steps", "schedule_steps", "train_pool", "max_new_tokens", "top_k", "weight_decay",
                     "grad_clip", "eval_every", "eval_size", "threads", "user_code_timeout_s")
        if self.group_size < 1:
            raise ValueError(f"group_size (G) must be >= 1, got {self.group_size}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not 0 <= self.target_accuracy <= 1:
            raise ValueError(f"target_accuracy must be in [0, 1] (0 = off), got "
                             f"{self.target_accuracy}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        for name, ceiling in CEILINGS.items():
            value = functools.reduce(getattr, name.split("."), self)  # "ppo.vf_lr": self.ppo.vf_lr
            if value > ceiling:
                raise ValueError(f"{name}={value} is above its ceiling {ceiling} "
                                 f"(config.CEILINGS): {CEILING_WHY[name]}")
        if len(set(self.task_names)) != len(self.task_names):
            raise ValueError(f"task {self.task!r} names a task twice")
        lookup(("outcome", "process"), self.supervision, "supervision")
        fields_finite(self, "top_p")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1 = off), got {self.top_p}")
        if self.answer_format != "raw" and not self.max_new_tokens:
            self.max_new_tokens = 64                 # a sentence, not the toy's answer + 2
        lookup(("constant", "cosine"), self.lr_schedule, "lr_schedule")
        lookup(CKPT_FORMATS, self.ckpt_format, "ckpt_format")
        if not any(self.reward_weights.values()):
            raise ValueError(f"reward_weights {self.reward_weights} weigh every reward by 0 "
                             f"(or name none): every reward would be 0 and nothing learned")
        for name, w in self.reward_weights.items():
            check_number(f"reward weight of {name!r}", w, lambda v: True, "a finite number")
        fields_nonnegative(self, "checkpoint_every")
        fields_positive(self, "micro_batches")
        if self.micro_batches > self.prompts_per_step:
            raise ValueError(f"micro_batches={self.micro_batches} is more than the "
                             f"prompts_per_step={self.prompts_per_step} prompts to split "
                             f"(a micro-batch holds whole prompts)")
        if self.hf.gradient_checkpointing and self.checkpoint_every > 1:
            raise ValueError(f"hf.gradient_checkpointing=True checkpoints every layer, "
                             f"checkpoint_every={self.checkpoint_every} every "
                             f"{self.checkpoint_every}-th: set one of them")


CONFIG_FIELDS.update(f.name for f in dataclasses.fields(TrainConfig))   # no block takes one


def check_records(cfg: TrainConfig) -> TrainConfig:
    """Ask each record ``cfg`` names to check it -> cfg: the objective, the tasks, estimator,
    aggregation, rewards and trackers, the settings blocks, the policy and rollout kinds, the
    grouper, the exchange, PPO's critic (each kind's checks live with its records:
    step.check_objective, policy.check_policy, exchanges.check_exchange, a settings block's
    ``check``: the grouper's is group_config.Group.check). ``preset()``, ``from_dict()`` and
    the trainer's ``setup`` call it, once per config object (``TrainConfig()`` checks its own
    fields only, so building one loads none of these records)."""
    from grpo_lab.agents import step as agents  # noqa: F401 (environments, objective "agent")
    from grpo_lab.algorithm.advantages import ADVANTAGES
    from grpo_lab.algorithm import vllm_rollout  # noqa: F401 (its kind registers)
    from grpo_lab.algorithm.rollout import ROLLOUTS
    from grpo_lab.distributed.exchanges import check_exchange
    from grpo_lab.policies.policy import check_policy
    from grpo_lab.tasks import TASKS, countdown, word_problems  # noqa: F401 (they register their families)
    from grpo_lab.tasks.instruct import check_config as check_instruct
    from grpo_lab.tasks.rewards import resolve_rewards
    from grpo_lab.training.ppo import CRITICS          # and objective "ppo"
    from grpo_lab.training.step import check_objective
    from grpo_lab.training.trackers import sink_names
    if cfg.__dict__.get("_checked"):
        return cfg
    check_exchange(cfg)                       # first: the others read its capabilities
    check_policy(cfg)
    lookup(ROLLOUTS, cfg.rollout, "rollout").check(cfg)
    for t in cfg.task_names:
        lookup(TASKS, t, "task", f"in task={cfg.task!r}: several join by commas, or 'mixture'")
    lookup(ADVANTAGES, cfg.advantage, "advantage")
    cfg.speed.check(cfg)
    for block in cfg.blocks.values():      # each record's settings check themselves
        if hasattr(block, "check"):
            block.check(cfg)
    if cfg.objective != "agent":             # an environment writes its own prompts (agents/)
        check_instruct(cfg.task_names, cfg.answer_format, cfg.policy, cfg.supervision)
    if cfg.ckpt_format == "dcp" and not cfg.exchange.kind.torch_adamw:
        raise ValueError(f"ckpt_format='dcp' saves the state of torch's AdamW; exchange "
                         f"{cfg.exchange.name!r} steps its own Adam: write "
                         f"ckpt_format='single' or pick an exchange that steps torch's AdamW")
    sink_names(cfg.report_to)               # known sinks; their packages: at train start
    resolve_rewards(cfg.reward_weights)
    lookup(CRITICS, cfg.ppo.critic, "ppo.critic")
    check_objective(cfg)                    # its own check last: it may read the others
    cfg.__dict__["_checked"] = True
    return cfg


PRESETS: dict[str, dict] = {
    # the field defaults as they are (lr 1e-4, beta 0.02, evaluation every 100 steps, no target):
    # the experiments harness and the benches' control, so their recorded results keep meaning
    "defaults": {},
    # the README's demo (`make demo`), tuned for time to accuracy (BENCHMARKS.md section 13):
    # lr 3e-4 with beta 0 (no reference policy to run) reached 90% held-out in 2200 +- 248
    # steps over 3 seeds where the field defaults (lr 1e-4, beta 0.02) reached it in 1 seed of
    # 3 by step 3000; DAPO's dynamic sampling then cut that to ~1350 steps (1.25x the cost per
    # step: 53.8-78.4 s on an idle 2-core machine); stops at the first evaluation at 90% (or
    # after 3000 steps). No wall-clock budget: a laptop busy with other work reaches the same
    # target later instead of being stopped short of it (the 300 s default stopped it at 80%
    # at load 6-16)
    "tiny_cpu": {"lr": 3e-4, "kl": {"beta": 0.0}, "dynamic": {"sampling": True},
                 "eval_every": 50, "target_accuracy": 0.9, "time_budget_s": 0.0},
    # the supervised warm-up that made data/base_policy.safetensors (`grpo-lab pretrain`,
    # pretrain.py, writes a fresh policy and runs this from it): cross-entropy on the answers
    # of 64 demonstrations a step, drawn from one seeded stream; AdamW lr 2e-3, weight decay
    # 0.01, no clipping or warm-up, cosine over 2000 steps stopped at 1800 (partly competent)
    "pretrain_cpu": {"objective": "pretrain", "task": "addition,sort,reverse",
                     "prompts_per_step": 64, "group_size": 1, "lr": 2e-3, "weight_decay": 0.01,
                     "grad_clip": 0.0, "warmup_steps": 0, "steps": 1800, "schedule_steps": 2000,
                     "kl": {"beta": 0.0}, "time_budget_s": 0.0, "eval_every": 0, "eval_size": 0,
                     "ckpt_every": 1000},
    # multi-turn GRPO on an environment (agents/, objective "agent"): the guessing game from a
    # policy warmed up on it (bench/bench_agents.py writes runs/agents/guess_warm.safetensors);
    # dynamic sampling off (it redraws by single-turn rewards), no reference (beta 0)
    "agent_cpu": {"objective": "agent", "task": "guess", "dynamic": {"sampling": False},
                  "kl": {"beta": 0.0}, "lr": 3e-4, "temperature": 1.0, "prompts_per_step": 8,
                  "group_size": 8, "steps": 200, "eval_every": 50, "eval_size": 72,
                  "base_checkpoint": "runs/agents/guess_warm.safetensors"},
    "quick": {"steps": 30, "time_budget_s": 0.0, "prompts_per_step": 8, "group_size": 4,
              "eval_every": 10, "eval_size": 50, "ckpt_every": 10},
    # the 7-family mixture from a base that knows each family a little (data/README.md);
    # 4 prompts per family per step; with grouping kmeans_semantic, 57.0% -> 60.9% held out
    # (best 62.1%) in 53 s, one thread (bench/RESULTS_mixture_cpu.md names the CPU and load)
    "mixture_cpu": {"task": "mixture", "base_checkpoint": "data/base_mixture.safetensors",
                    "prompts_per_step": 28, "steps": 300, "eval_every": 50, "eval_size": 100},
    # the tiny offline transformers model (Llama-style, data/hf_tiny, data/README.md) through
    # hf.py: the HF code path end to end on a laptop CPU, nothing downloaded
    "hf_tiny_cpu": {"policy": "hf", "base_checkpoint": "data/hf_tiny", "steps": 300,
                    "eval_every": 50, "eval_size": 200},
    # a real model on GPUs: grpo-lab train --preset hf_gpu --nproc <GPUs> (torchrun, NCCL;
    # docs/guide/hugging-face.md); bf16 autocast over fp32 weights and AdamW (0.5B: 8 GB),
    # chat template, activation checkpointing.
    # Untested here (no GPU, no network): the numbers are a starting point, not a result.
    "hf_gpu": {"policy": "hf", "base_checkpoint": "Qwen/Qwen2.5-0.5B-Instruct",
               "hf": {"autocast": True, "chat_template": True, "gradient_checkpointing": True},
               "temperature": 1.0,
               "prompts_per_step": 64, "group_size": 8, "lr": 1e-6, "kl": {"beta": 0.0},
               "steps": 500, "time_budget_s": 0.0, "eval_every": 50, "eval_size": 200,
               "ckpt_every": 100, "adam_eps": 1e-6,
               # instruct formats (instruct.py): each task asked in words, the answer read
               # from <answer></answer> tags (or the last number), a format reward for the tags;
               # room for a short working before the answer
               "task": "addition,word_problems", "answer_format": "tags",
               "reward_weights": {"accuracy": 1.0, "format": 0.2}, "max_new_tokens": 128},
    # SmolLM2-135M-Instruct on a 2-core CPU (grpo-lab model get smollm2-135m, models.py):
    # 2-digit sums asked in words; the system prompt asks for the equation with its result in
    # \boxed{} (no worked example: the base copies an example's numbers), the accuracy reward
    # reads the answer whatever wraps it, a small format reward for \boxed{}; 4 prompts x 8
    # completions of at most 24 tokens at temperature 0.8 (the base gets about 5% of sampled
    # sums right: 8 samples find one in more groups than 4); 10 minutes of training
    # (BENCHMARKS.md section 16 has base vs after over 3 seeds). A format reward as large as
    # the accuracy's taught \boxed{} in 4 steps and cost the arithmetic (the model boxed a
    # guess at once): format 0.5 -> 0.25, and the accuracy reward leads.
    # float32 on purpose: on a CPU without bf16 units (this one: AMD EPYC, AVX2) a bf16 matmul
    # forward + backward took 14.6 s where float32 took 1.0 s (1280 x 576 @ 576 x 1536, one
    # thread); on a CPU with AVX-512 BF16 / AMX, --hf.autocast true is the faster choice
    "smollm_cpu": {"policy": "hf", "base_checkpoint": "smollm2-135m", "hf": {"chat_template": True},
                   "task": "addition", "answer_format": "boxed",
                   "system_prompt": "You are a calculator. Reply with the equation, and put its "
                                    "result in \\boxed{}.",
                   "reward_weights": {"accuracy": 1.0, "format": 0.25}, "max_new_tokens": 24,
                   "temperature": 0.8, "prompts_per_step": 4, "group_size": 8, "lr": 1e-5,
                   "kl": {"beta": 0.0}, "warmup_steps": 2, "lr_schedule": "constant", "steps": 200,
                   "time_budget_s": 600.0, "eval_every": 0, "eval_size": 50, "ckpt_every": 1000},
}


SUB_CONFIGS = ("exchange", "ppo", "hf", "speed")
"""TrainConfig's sub-config fields; ``sub_configs()`` adds the settings blocks."""


def sub_configs() -> tuple:
    """The names a config holds as a nested mapping: SUB_CONFIGS and every settings block."""
    from grpo_lab.algorithm import variants  # noqa: F401 (the built-in blocks register)
    from grpo_lab.registry import SETTINGS
    return SUB_CONFIGS + tuple(SETTINGS)


def merge(*parts: dict) -> dict:
    """Config overrides, later parts winning; a sub-config's or settings block's dict is merged
    into the one before it, not replaced ({"kl": {"beta": 0}} + {"kl": {"clamp": 10}})."""
    subs, out = sub_configs(), {}
    for part in parts:
        for k, v in part.items():
            both = k in subs and isinstance(v, dict) and isinstance(out.get(k), dict)
            out[k] = {**out[k], **v} if both else v
    return out


def preset(name: str, **overrides) -> TrainConfig:
    """A TrainConfig from a named preset, with field overrides (a sub-config, e.g. ``exchange``,
    as a dict merged into the preset's, or its dataclass). The config's plugins are imported
    first, so it may name what they register; a grouper given as a function or record is
    registered (grouping.get_grouper) and the config keeps its name."""
    from grpo_lab.algorithm.grouping import get_grouper
    lookup(PRESETS, name, "preset")
    load_plugins(overrides.get("plugins", PRESETS[name].get("plugins", "")))  # their blocks
    fields = merge(PRESETS[name], overrides)
    if not isinstance(fields.get("grouping", ""), str):   # a function or record: registered
        fields["grouping"] = get_grouper(fields["grouping"]).name   # the config keeps its name
    return check_records(TrainConfig(**fields))


def from_dict(d: dict) -> TrainConfig:
    """A TrainConfig from ``to_dict``'s output (a checkpoint's or a report's config); its plugins
    are imported first."""
    if not isinstance(d, dict):
        raise ValueError(f"a config is a dict of fields (to_dict's output), got "
                         f"{type(d).__name__} {d!r:.80}")
    d = upgrade_saved(d)                               # older names in today's meaning
    load_plugins(d.get("plugins", ""))
    return check_records(TrainConfig(**d))


CKPT_FORMATS = ("single", "dcp")
"""TrainConfig.ckpt_format's values."""

def to_dict(cfg) -> dict:
    """The config as plain data: fields, sub-configs and settings blocks as nested dicts."""
    d = dataclasses.asdict(cfg)
    blocks = d.pop("blocks")
    return {**d, **blocks}
