"""Environments and tools as records: what a multi-turn episode talks to.

An environment is a class the run makes one instance of per episode (TRL's
``environment_factory``, OpenEnv's ``Env``: state lives in the instance):

    env = record.make()
    observation = env.reset(example, seed)          # the first observation ("" for none)
    observation, reward, done = env.step(action)    # the policy's action text -> the next
    key = env.state_key()                           # what makes two states "the same"

``state_key`` is read before each action: GiGPO's step groups (credit.py) gather the actions
the G episodes of one prompt took from states with equal keys (the paper's anchor states,
compared exactly, as verl-agent does without its similarity option). The environment record
(``Environment``) holds the class, the task it draws prompts from (a task of ``tasks.TASKS``
registered beside it, so ``TrainConfig.task`` selects it like any task and its held-out set
is excluded from training as any task's) and its ``AgentSettings``: the turn and token limits,
the credit assignment and its parameters. Every agent setting lives on that record, not on
``TrainConfig``: a variant of an environment is another record (``register_environment(...,
settings=AgentSettings(credit="gigpo"))``), so a study compares them as it compares tasks.

A tool is the stateless case: a name and a function of parsed string arguments returning text
(TRL's ``tools=[fn]``, nanochat's calculator). ``ToolEnvironment`` wraps a task and some tools:
an action in the call syntax is run and its result is the observation; any other action is the
answer, scored by the task's answer and ending the episode. The toy's call syntax uses
characters of its alphabet no task writes (tokenizer.ALPHABET): ``?name:arg,arg`` (``CALL``,
``SEPARATOR``, ``ARGS``).

Errors (documented behaviour, tests/test_agents.py):
  * a malformed call, an unknown tool, a tool that raises: the observation ``"error: ..."``
    (the policy wrote something wrong; the episode goes on);
  * an environment whose make (its constructor), reset, step, state_key or metrics raises, or
    returns the wrong types: an ``EnvironmentFailed`` naming the environment, the call, the
    action and the episode's turn (its code is wrong, not the policy: the run stops with that
    one line, as for a reward function that raises);
  * user code that runs past ``TrainConfig.user_code_timeout_s`` (timelimit.py): the run's
    ``UserCodeTimeout`` naming the environment, the call and the turn;
  * an observation longer than ``AgentSettings.max_observation_tokens``: cut there (the
    episode records it: ``episode/obs_cut_frac``); characters the policy cannot read are
    dropped (``Episodes`` counts them too).
"""
from __future__ import annotations

import inspect
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Callable, Hashable

from grpo_lab.registry import check_new, check_number, check_types, lookup
from grpo_lab.tasks import TASKS, Example
from grpo_lab.timelimit import user_code

CALL, SEPARATOR, ARGS = "?", ":", ","
"""The toy's tool-call syntax: an action ``?name:a,b`` calls tool ``name`` with ("a", "b")."""


@dataclass(frozen=True)
class AgentSettings:
    """An environment's settings (its record's ``settings``): limits, credit, their parameters."""
    max_turns: int = 4
    """Policy turns per episode; an episode still going after the last is truncated by turns."""
    max_action_tokens: int = 4
    """Tokens of one action, its terminator (<eos>) included; an action that has not ended by
    then ends the episode, truncated by tokens."""
    max_observation_tokens: int = 8
    """Tokens of one observation; a longer one is cut to this many (recorded)."""
    stop: str = ""
    """An action also ends after a token whose text contains this ("": at <eos> only). The
    calculator's "=": the policy writes ``964 * 59 =``, the action ends there, the environment
    computes it and its result is forced into the sequence (nanochat's ``Engine``)."""
    credit: str = "episode"
    """How the episode's reward becomes per-token advantages (one of credit.CREDITS):
    "episode" (every policy token gets its episode's group-relative advantage), "gigpo"
    (that plus omega x the step advantage of GiGPO's anchor-state step groups) or "mtgrpo"
    (that plus turn_coef x MT-GRPO's turn-level advantage on the intermediate turns)."""
    omega: float = 1.0
    """GiGPO: weight of the step advantage (the paper's omega, eq. 8; its runs: 1)."""
    gamma: float = 0.95
    """GiGPO: discount of the step returns R_t = sum_k gamma^(k-t) r_k (eq. 5; the paper: 0.95)."""
    step_norm: str = "std"
    """GiGPO: the step advantage's F_norm (eq. 7): "std" (divide by the step group's std,
    the paper's) or "none" (mean-centred only, as verl-agent's default mode "mean_norm" does
    to A^S; that mode also drops the std from the episode term, which here is the run's
    estimator: ``advantage="mean_centred"``)."""
    turn_coef: float = 1.0
    """MT-GRPO: weight of the turn-level advantage (the paper's lambda; its code's
    ``turn_advantage_coef``, default 1)."""

    def __post_init__(self):
        check_types(self, "AgentSettings.")             # "0.5" for gamma, True for omega, ...
        for name in ("max_turns", "max_action_tokens", "max_observation_tokens"):
            check_number(f"AgentSettings.{name}", getattr(self, name), lambda x: x >= 1,
                         "an int >= 1")
        check_number("AgentSettings.gamma", self.gamma, lambda x: 0 <= x <= 1, "in [0, 1]")
        for name in ("omega", "turn_coef"):
            check_number(f"AgentSettings.{name}", getattr(self, name), what="a number >= 0")
        from grpo_lab.agents.credit import STEP_NORMS, get_credit
        lookup(STEP_NORMS, self.step_norm, "step_norm")
        get_credit(self.credit)


@dataclass(frozen=True)
class Environment:
    """A registered environment: ``make()`` -> an instance with reset / step / state_key."""
    name: str
    make: Callable
    settings: AgentSettings = field(default_factory=AgentSettings)
    description: str = ""
    demo: Callable | None = None
    """A scripted player, ``demo(instance, rng) -> action``, for a supervised warm-up
    (warmup.py); None: none."""


@dataclass(frozen=True)
class Tool:
    """A stateless tool: ``fn(*args: str) -> text`` under ``name``."""
    name: str
    fn: Callable
    description: str = ""


class EnvironmentFailed(RuntimeError):
    """An environment's own code raised, or returned what the interface does not allow."""


ENVIRONMENTS: dict[str, Environment] = {}
TOOLS: dict[str, Tool] = {}


def register_environment(name: str, make: Callable, task: Callable | None = None,
                         settings: AgentSettings | None = None, description: str = "",
                         demo: Callable | None = None, **task_fields) -> Environment:
    """Add an environment -> its record. ``make()`` builds one episode's instance; ``demo``: a
    scripted player for a warm-up (``Environment.demo``); ``task``:
    ``make_example(rng) -> Example(prompt, answer, name)``, registered as the task ``name``
    (``tasks.register_task``'s checks; ``task_fields`` are its other arguments:
    ``answer_chars``, ``max_answer_len``, ``eval_fn``, ...), so ``--task name`` selects it. A
    task already registered under ``name`` is used as it is when ``task`` is None."""
    from grpo_lab.tasks import register_task
    check_new(ENVIRONMENTS, "environment", name, make, lambda e: e.make)
    settings = settings or AgentSettings()
    if not isinstance(settings, AgentSettings):
        raise ValueError(f"environment {name!r}: settings must be an AgentSettings, got "
                         f"{settings!r}")
    for method in ("reset", "step", "state_key"):
        if inspect.isclass(make) and not callable(getattr(make, method, None)):
            raise ValueError(f"environment {name!r}: {make.__name__} has no method {method}() "
                             f"(an environment has reset(example, seed), step(action), "
                             f"state_key())")
    if task is not None:
        register_task(name, task, description=description, **task_fields)
    elif name not in TASKS:
        raise ValueError(f"environment {name!r} needs a task to draw its prompts from: pass "
                         f"task=make_example (tasks.register_task's make) or register the task "
                         f"{name!r} first")
    ENVIRONMENTS[name] = Environment(name, make, settings, description, demo)
    return ENVIRONMENTS[name]


def with_settings(name: str, new_name: str, **settings) -> Environment:
    """Register environment ``name`` again as ``new_name`` with some settings changed (and its
    task under the new name): a variant a study compares as another arm."""
    from grpo_lab.tasks import register_task
    env, task = get_environment(name), TASKS[name]

    def make_example(rng, _make=task.make):
        return replace(_make(rng), task=new_name)
    make_example.__qualname__ = f"{new_name}_examples"
    make_example.__module__ = env.make.__module__
    check_new(TASKS, "task", new_name, make_example, lambda t: t.make)   # another's: refused
    if new_name not in TASKS:
        register_task(new_name, make_example, task.answer_chars, task.max_answer_len,
                      eval_fn=None if task.eval_fn is None else
                      (lambda _f=task.eval_fn: [replace(e, task=new_name) for e in _f()]),
                      description=task.description, alphabet=task.alphabet)
    ENVIRONMENTS[new_name] = replace(env, name=new_name,
                                     settings=replace(env.settings, **settings))
    return ENVIRONMENTS[new_name]


def get_environment(name: str) -> Environment:
    return lookup(ENVIRONMENTS, name, "environment",
                  "register your own with agents.environments.register_environment")


def register_tool(name: str, fn: Callable, description: str = "") -> Tool:
    """Add a tool -> its record (the registry's naming rule: registry.check_new)."""
    check_new(TOOLS, "tool", name, fn, lambda t: t.fn)
    if not name.isalpha() or not name.islower():
        raise ValueError(f"tool name {name!r} must be lower-case letters (the toy writes it)")
    TOOLS[name] = Tool(name, fn, description or (fn.__doc__ or "").strip().split("\n")[0])
    return TOOLS[name]


# ---- calling user code: under the time limit, its failures named

def _call(env: Environment, call: str, fn, action: str | None = None,
          turn: int | None = None):
    """``fn()`` under the time limit; what it raises, an ``EnvironmentFailed`` naming the
    environment, the call (and the action, and the episode's turn, counted from 1)."""
    at = "" if turn is None else f" at turn {turn}"
    with user_code(f"environment {env.name!r} {call}{at}"):
        try:
            return fn()
        except Exception as e:
            on = "" if action is None else f" on action {action[:40]!r}"
            raise EnvironmentFailed(f"environment {env.name!r}: {call}{on}{at} raised "
                                    f"{type(e).__name__}: {e}") from e


def env_make(env: Environment):
    """``env.make()`` under the time limit: one episode's instance (a constructor that raises
    or hangs is the environment's failure, named, as its reset's is)."""
    return _call(env, "make()", env.make)


def env_metrics(env: Environment, instance) -> Mapping:
    """``instance.metrics()`` under the time limit, checked a mapping ({} without the method:
    ``tool_metrics`` reads it)."""
    if not callable(getattr(instance, "metrics", None)):
        return {}
    out = _call(env, "metrics()", instance.metrics)
    if not isinstance(out, Mapping):
        raise EnvironmentFailed(f"environment {env.name!r}: metrics() must return a dict "
                                f"(e.g. {{\"calls\": n, \"well_formed\": k}}), got {out!r:.120}")
    return out


def env_reset(env: Environment, instance, example: Example, seed: int) -> str:
    """``instance.reset(example, seed)`` under the time limit -> its observation (a str)."""
    obs = _call(env, "reset()", lambda: instance.reset(example, seed))
    if not isinstance(obs, str):
        raise EnvironmentFailed(f"environment {env.name!r}: reset() must return the first "
                                f"observation as a str, got {type(obs).__name__}")
    return obs


def env_step(env: Environment, instance, action: str,
             turn: int | None = None) -> tuple[str, float, bool]:
    """``instance.step(action)`` under the time limit -> (observation, reward, done), checked;
    its errors name ``turn`` (the episode's, from 1) when given."""
    out = _call(env, "step()", lambda: instance.step(action), action, turn)
    ok = (isinstance(out, tuple) and len(out) == 3 and isinstance(out[0], str)
          and isinstance(out[1], numbers.Real) and not isinstance(out[1], bool)  # numpy's too
          and out[1] == out[1] and abs(out[1]) != float("inf") and _is_flag(out[2]))
    if not ok:
        at = "" if turn is None else f" at turn {turn}"
        raise EnvironmentFailed(f"environment {env.name!r}: step({action[:40]!r}){at} must "
                                f"return (observation str, finite reward, done bool), got "
                                f"{out!r:.120}")
    return out[0], float(out[1]), bool(out[2])


def _is_flag(done) -> bool:
    """``done`` equals True or False (a bool, numpy's, a 0-d tensor, 0 or 1); not None, a str
    (``"False"`` is truthy: it would end the episode) or an array (its truth value raises)."""
    try:
        return done in (True, False)
    except (TypeError, ValueError, RuntimeError):       # an array's truth value is ambiguous
        return False


def env_key(env: Environment, instance, turn: int | None = None) -> Hashable:
    """``instance.state_key()`` under the time limit, checked hashable (``turn``: env_step's)."""
    def hashable_key():
        key = instance.state_key()
        hash(key)
        return key
    return _call(env, "state_key()", hashable_key, turn=turn)


# ---- tools behind an environment

def parse_call(action: str) -> tuple[str, list[str]] | None:
    """``"?name:a,b"`` -> ("name", ["a", "b"]); None when the action is not a call (an
    answer); a ValueError saying what is malformed when it starts like a call but is not one."""
    if not action.startswith(CALL):
        return None
    name, sep, rest = action[1:].partition(SEPARATOR)
    if not sep or not name:
        raise ValueError(f"a call is {CALL}name{SEPARATOR}args")
    return name, rest.split(ARGS) if rest else []


def call_tool(tools: dict, action: str) -> str:
    """Run the call ``action`` -> the tool's text, or ``"error: ..."`` (never raises, but the
    time limit: a tool that hangs stops the run as any user code does)."""
    try:
        name, args = parse_call(action)
    except ValueError as e:
        return f"error: {e}"
    if name not in tools:
        return f"error: no tool {name}"
    with user_code(f"tool {name!r}"):
        try:
            return str(tools[name].fn(*args))
        except Exception as e:                         # the policy's arguments were wrong
            return f"error: {type(e).__name__}"


class ToolEnvironment:
    """A task with tools: calls are answered by the tools, any other action is the answer
    (reward 1 if it equals the example's answer, else 0; the episode ends). A
    subclass, ``offers``, names the tools it offers (default: every registered tool)."""
    offers: tuple = ()

    def reset(self, example: Example, seed: int) -> str:
        self.example, self.calls = example, 0
        self.tools = {n: TOOLS[n] for n in (self.offers or TOOLS)}
        return ""

    def step(self, action: str):
        if action.startswith(CALL):
            self.calls += 1
            return call_tool(self.tools, action), 0.0, False
        return "", float(action == self.example.answer), True

    def state_key(self):
        return (self.example.prompt, self.calls)


def tool_metrics(infos: list) -> dict:
    """Tool use over episodes, from each instance's ``metrics()`` -> {"calls": n,
    "well_formed": k} (an environment without that method gives none): ``call_rate`` (the
    share of episodes with a call), ``well_formed`` (the share of calls that parsed),
    ``calls_per_episode``. {} when no episode reports calls."""
    rows = [m for m in infos if m and "calls" in m]
    if not rows:
        return {}
    calls = sum(m["calls"] for m in rows)
    return {"call_rate": sum(m["calls"] > 0 for m in rows) / len(rows),
            "calls_per_episode": calls / len(rows),
            "well_formed": (sum(m.get("well_formed", 0) for m in rows) / calls) if calls
            else float("nan")}


def refuse_environment_tasks(cfg) -> None:
    """The single-turn GRPO objective's check: an environment's task is multi-turn."""
    envs = [t for t in cfg.task_names if t in ENVIRONMENTS]
    if envs:
        raise ValueError(f"task {envs[0]!r} is an environment (multi-turn episodes): train it "
                         f"with objective='agent', not objective={cfg.objective!r}")
