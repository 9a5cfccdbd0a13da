"""Environments from the field's libraries, through one adapter: OpenEnv's ``Environment``
interface (``openenv-core``, the interface TRL's environment mode speaks) and TextArena's text
games (``textarena``, wrapped as an OpenEnv environment, as OpenEnv's own ``textarena_env``
does), as grpo_lab environment records (environments.py). Both packages are optional extras
(the ``openenv`` extra: ``pip install -e ".[openenv]"`` in a checkout); nothing here imports them until an environment is made,
and nothing reaches the network: the environment runs in this process (OpenEnv's server-side
class, called directly, not through its HTTP or WebSocket client).

The adapter (``OpenEnvAdapter``) turns an OpenEnv environment into what a multi-turn episode
talks to (environments.py):

    reset(example, seed)  -> env.reset(seed=seed, **example.fields["reset_kwargs"])
                             -> text_of(observation)                (the first observation)
    step(action text)     -> env.step(action_of(text)) -> (text_of(obs), obs.reward, obs.done)
    state_key()           -> key_of(adapter), by default the transcript so far: the first
                             observation and each (action, observation) after it

OpenEnv's observation carries ``reward`` (None: 0) and ``done``; ``action_of`` builds the
environment's ``Action`` from the policy's text and ``text_of`` reads the observation's text.
By default both find the one string field there is: the ``Action`` class named by the
annotation of ``step``'s ``action`` argument, built with the text in its one required string
field (OpenEnv's echo: ``EchoAction(message=...)``), and the observation's one string field
besides ``done``, ``reward`` and ``metadata``; an environment with more than one says so and
asks for the function. They are also where a policy's own language meets the environment's:
the toy writes ``7`` where TextArena's GuessTheNumber reads ``[7]``, and reads ``<`` where it
says "The target number is lower." (``TEXTARENA_GUESS`` below). An example may pin the reset
seed (``example.fields["seed"]``: a held-out set of fixed games); otherwise the run's reset seed
is used (the G episodes of a prompt share it, environments.py).

The default state key is exact but narrow: two episodes stand in the same state only after the
same actions and observations. Give ``key_of`` where the environment's own state says more
(GuessTheNumber: the range the hints leave open, whatever guesses led there).

TextArena (``TextArenaEnvironment``, made by ``textarena_environment(env_id, **kwargs)``): a
game from ``textarena.make(env_id)``, one player, reset with the seed; the observation text is
the messages the game added since the last one (TextArena's state hands each player's new
observations once; its observation wrappers re-send the whole history, so the unwrapped game
is read), ``reward`` the game's reward for player 0 once it is over (``state.rewards``), 0
before. TextArena seeds Python's global ``random`` in every reset (``ta.State``) and its games
draw from it; the wrapper keeps each game's own ``random`` state and swaps it in around the
game's calls, so episodes stepped in any order are each reproducible from their seed and the
caller's global ``random`` is left as it was. Wordle, Hangman and other word games load NLTK's
word lists, which NLTK downloads on first use: with no network they need ``nltk.download`` run
beforehand; GuessTheNumber, Countdown, Mastermind and other games without word lists run as
installed.

Errors: a missing package is an ImportError naming the extra; OpenEnv code that raises is the
run's ``EnvironmentFailed`` (environments.env_step names the environment, the call and the
action), as any environment's.
"""
from __future__ import annotations

import random
import re
import typing
from functools import cache
from typing import Callable

from grpo_lab.agents.environments import AgentSettings, Environment, register_environment

EXTRA = "openenv"
"""The optional extra that installs both packages (pyproject.toml)."""

OBS_FIELDS_SKIPPED = ("done", "reward", "metadata")


def _require(module: str, package: str):
    import importlib
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"{package} is not installed: pip install {package} (in a checkout: "
                          f"pip install -e \".[{EXTRA}]\") to use it") from e


def action_class(env) -> type:
    """The ``Action`` subclass ``env.step`` is annotated with."""
    try:
        hints = typing.get_type_hints(type(env).step)
    except Exception:                                  # an annotation that does not resolve
        hints = {}
    cls = hints.get("action")
    if not isinstance(cls, type):
        raise ValueError(f"{type(env).__name__}.step has no Action class annotation on its "
                         f"'action' argument: pass action_of=(text -> Action)")
    return cls


def default_action_of(env) -> Callable[[str], object]:
    """text -> the env's Action with the text in its one required str field."""
    cls = action_class(env)
    fields = [n for n, f in cls.model_fields.items()
              if f.is_required() and f.annotation is str]
    if len(fields) != 1:
        raise ValueError(f"{cls.__name__} has {len(fields)} required str fields "
                         f"({fields}): pass action_of=(text -> {cls.__name__}) to say how the "
                         f"policy's text becomes an action")
    return lambda text: cls(**{fields[0]: text})


def default_text_of(obs) -> str:
    """The observation's one str field besides done, reward and metadata."""
    texts = [n for n, v in obs if n not in OBS_FIELDS_SKIPPED and isinstance(v, str)]
    if len(texts) != 1:
        raise ValueError(f"{type(obs).__name__} has {len(texts)} str fields ({texts}): pass "
                         f"text_of=(observation -> str) to say what the policy reads")
    return getattr(obs, texts[0])


def transcript_key(adapter: "OpenEnvAdapter"):
    """The default state key: the first observation and every (action, observation) since."""
    return tuple(adapter.transcript)


class OpenEnvAdapter:
    """One episode of an OpenEnv environment as a grpo_lab environment instance (module
    docstring). ``env``: an ``openenv.core.env_server.interfaces.Environment``."""

    def __init__(self, env, action_of: Callable | None = None, text_of: Callable | None = None,
                 key_of: Callable | None = None):
        self.env = env
        self.action_of = action_of or default_action_of(env)
        self.text_of = text_of or default_text_of
        self.key_of = key_of or transcript_key
        self.transcript: list = []

    def reset(self, example, seed: int) -> str:
        fields = example.fields or {}
        obs = self.env.reset(seed=fields.get("seed", seed), **fields.get("reset_kwargs", {}))
        text = self.text_of(obs)
        self.transcript = [text]
        return text

    def step(self, action: str):
        obs = self.env.step(self.action_of(action))
        text = self.text_of(obs)
        self.transcript += [action, text]
        reward = 0.0 if obs.reward is None else float(obs.reward)
        return text, reward, bool(obs.done)

    def state_key(self):
        return self.key_of(self)


def register_openenv(name: str, factory: Callable, task: Callable | None = None,
                     action_of: Callable | None = None, text_of: Callable | None = None,
                     key_of: Callable | None = None, settings: AgentSettings | None = None,
                     description: str = "", demo: Callable | None = None,
                     **task_fields) -> Environment:
    """Register an OpenEnv environment as the grpo_lab environment ``name`` -> its record.
    ``factory()`` makes one OpenEnv environment (one per episode); ``action_of``, ``text_of``,
    ``key_of``: the adapter's (module docstring); the rest: ``register_environment``'s."""
    def make(_factory=factory):
        return OpenEnvAdapter(_factory(), action_of, text_of, key_of)
    make.__qualname__ = f"openenv_{name}"
    make.__module__ = getattr(factory, "__module__", __name__)
    return register_environment(name, make, task, settings, description, demo, **task_fields)


# ---- TextArena as an OpenEnv environment

@cache
def _textarena_classes():
    """(TextArenaAction, TextArenaObservation, TextArenaState, TextArenaEnvironment), built
    on first use (they subclass openenv's models, which import only when asked for)."""
    interfaces = _require("openenv.core.env_server.interfaces", "openenv-core")
    types = _require("openenv.core.env_server.types", "openenv-core")
    ta = _require("textarena", "textarena")

    class TextArenaAction(types.Action):
        """What the player says (TextArena reads the move from it, e.g. ``[7]``)."""
        message: str

    class TextArenaObservation(types.Observation):
        """The game's messages since the last observation."""
        text: str = ""

    class TextArenaState(types.State):
        env_id: str = ""
        turn: int = 0

    class TextArenaEnvironment(interfaces.Environment):
        """One player of a TextArena game behind OpenEnv's Environment API (module
        docstring), in this process."""
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self, env_id: str, **env_kwargs):
            super().__init__()
            self.env_id = env_id
            game = ta.make(env_id, **env_kwargs)
            while hasattr(game, "env"):                  # below its observation wrappers
                game = game.env
            self.game, self._random = game, None
            self._state = TextArenaState(env_id=env_id)

        def _call(self, fn, *args, **kw):
            """fn under this game's own ``random`` state; the caller's is put back after."""
            outer = random.getstate()
            try:
                if self._random is not None:
                    random.setstate(self._random)
                return fn(*args, **kw)
            finally:
                self._random = random.getstate()
                random.setstate(outer)

        def _observe(self) -> str:
            _, messages = self.game.get_observation()
            return "\n".join(str(m[1]).strip() if isinstance(m, tuple) else str(m).strip()
                             for m in messages)

        def reset(self, seed=None, episode_id=None, **kwargs) -> TextArenaObservation:
            """``kwargs``: game settings to change before the reset, each an attribute the
            game keeps from its constructor (GuessTheNumber's ``min_number``, ...)."""
            for k, v in kwargs.items():
                if not hasattr(self.game, k):
                    raise ValueError(f"{type(self.game).__name__} has no setting {k!r}")
                setattr(self.game, k, v)
            self._random = None
            self._call(self.game.reset, num_players=1, seed=seed)
            self._state = TextArenaState(env_id=self.env_id, episode_id=episode_id)
            return TextArenaObservation(text=self._observe(), done=False, reward=0.0)

        def step(self, action: TextArenaAction, timeout_s=None, **kwargs) -> TextArenaObservation:
            done, _ = self._call(self.game.step, action.message)
            self._state.step_count += 1
            self._state.turn = getattr(self.game.state, "turn", self._state.step_count)
            rewards = getattr(self.game.state, "rewards", None) or {}
            reward = float(rewards.get(0, 0.0)) if done else 0.0
            return TextArenaObservation(text=self._observe(), done=bool(done), reward=reward)

        @property
        def state(self) -> TextArenaState:
            return self._state

    return TextArenaAction, TextArenaObservation, TextArenaState, TextArenaEnvironment


def textarena_environment(env_id: str, **env_kwargs):
    """A TextArena game as an OpenEnv environment: ``TextArenaEnvironment(env_id, ...)``
    (``env_kwargs``: the game's own, e.g. ``min_number``, ``max_number``, ``max_turns``)."""
    return _textarena_classes()[3](env_id, **env_kwargs)


# ---- a shipped registration: TextArena's GuessTheNumber for the toy

WIDTH = 8
"""Numbers in a game: ranges of 8 as the toy's own ``guess`` (games.py), so the toy's prompts
``g:23-30=`` and its warm-up serve both."""
HINT = re.compile(r"The target number is (lower|higher)")


def guess_text_of(obs) -> str:
    """TextArena GuessTheNumber's text -> the toy's alphabet: ``<`` for "lower", ``>`` for
    "higher", ``?`` for anything else it says after a move (an invalid move); "" for its
    opening instructions and for the end of the game."""
    if obs.done or "You are Player" in obs.text:
        return ""
    m = HINT.search(obs.text)
    return "?" if m is None else "<" if m.group(1) == "lower" else ">"


def guess_action_of(text: str):
    """The toy's guess ``7`` -> TextArena's move ``[7]`` (any other text passes as it is: the
    game calls it invalid)."""
    action = _textarena_classes()[0]
    return action(message=f"[{text}]" if text.isdigit() else text)


def guess_range_key(adapter: OpenEnvAdapter):
    """GuessTheNumber's anchor state: the range its hints leave open (as the toy's ``guess``)."""
    game = adapter.env.game
    lo, hi = game.min_number, game.max_number
    for guess, hint in game.state.game_state.get("guess_history", []):
        if hint == "lower":
            hi = min(hi, guess - 1)
        else:
            lo = max(lo, guess + 1)
    return (lo, hi)


def guess_demo(adapter: OpenEnvAdapter, rng: random.Random) -> str:
    """A warm-up player (warmup.py): a number the hints so far leave possible."""
    lo, hi = guess_range_key(adapter)
    return str(rng.randint(lo, hi))


def _guess_example(lo: int, seed: int | None = None):
    from grpo_lab.tasks import Example
    hi = lo + WIDTH - 1
    fields = {"lo": lo, "hi": hi, "reset_kwargs": {"min_number": lo, "max_number": hi}}
    return Example(f"g:{lo}-{hi}=", "0", "ta_guess",
                   fields=fields if seed is None else {**fields, "seed": seed})


def textarena_guess_examples(rng: random.Random):
    """TextArena's GuessTheNumber on a range of 8 (``g:23-30=``); the secret is the game's,
    drawn from the reset seed, so the example's answer is a placeholder."""
    return _guess_example(rng.randrange(0, 101 - WIDTH))


def _textarena_guess_held_out():
    """The toy's held-out ranges (games.HELD_OUT_STARTS), 8 fixed games each (reset seeds
    0..7 pinned in the examples): 72 games."""
    from grpo_lab.agents.games import HELD_OUT_STARTS
    return [_guess_example(lo, s) for lo in HELD_OUT_STARTS for s in range(WIDTH)]


def _textarena_guess():
    return textarena_environment("GuessTheNumber-v0", max_turns=5)


def register_textarena_guess(**settings) -> Environment:
    """Register TextArena's GuessTheNumber for the toy as ``ta_guess`` (ranges of 8, 5 turns;
    the ``openenv`` extra is needed when an episode is made, not now). Reward: TextArena's, 1
    for the right number; a game lost at its turn limit or on a second invalid move pays its
    "percentage completion", 1 - |last guess - secret| / 7."""
    s = AgentSettings(**{"max_turns": 5, "max_action_tokens": 3, "max_observation_tokens": 1,
                         **settings})
    return register_openenv("ta_guess", _textarena_guess, textarena_guess_examples,
                            guess_action_of, guess_text_of, guess_range_key, s,
                            description="TextArena GuessTheNumber-v0 on ranges of 8 through "
                                        "OpenEnv's interface (grpo_lab[openenv])",
                            demo=guess_demo, answer_chars="0", max_answer_len=1,
                            eval_fn=_textarena_guess_held_out)
