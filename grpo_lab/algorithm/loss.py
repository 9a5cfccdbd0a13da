"""The GRPO loss (DeepSeekMath, Shao et al. 2024, eq. 3) on one screen.

    J = E[ 1/G sum_i 1/|o_i| sum_t { min(r_it A_it, clip(r_it, 1-eps_low, 1+eps_high) A_it)
                                      - beta * KL_it } ]
    r_it  = pi_theta(o_it | q, o_i<t) / pi_old(o_it | q, o_i<t)
    KL_it = pi_ref/pi_theta - log(pi_ref/pi_theta) - 1          (eq. 4, the "k3" estimator)

We minimise -J. Deviations, each a documented option:
  * eps_low and eps_high may differ ("clip-higher", DAPO, Yu et al. 2025).
  * The 1/G * 1/|o_i| average is one of three sibling aggregations in ``AGGREGATIONS``:
      ``seq_mean_token_mean`` (the paper), ``token_mean`` (DAPO: every token weighs the
      same), ``dr_grpo`` (Dr. GRPO, Liu et al. 2025: a constant normaliser N * max_len, so
      long and short answers are not re-weighted).
  * The policy-gradient term is one of the sibling surrogates of ``POLICY_LOSSES``
    (``clip``, the paper's, with optional dual-clip; ``two_sided``; ``cispo``; below).
  * Safety clamps (verl's), each off by default (0) so recorded runs stay bit-identical:
    ``clip.log_ratio_clamp`` clamps log(pi/pi_old) and log(pi_ref/pi) to [-c, c] before exp
    (verl: 20; e^20 = 4.9e8, so on-policy and near-policy tokens never reach it);
    ``kl.clamp`` clamps each token's KL estimate to [-c, c] (verl: 10 on k3).
    At a clamp's boundary the value is the unclamped one and torch.clamp passes the
    gradient (the boundary counts as inside); past it, value c and gradient 0.
  * ``kl.bias_correction`` (DeepSeek-V3.2, TRL's ``use_bias_correction_kl``): each token's KL
    estimate is multiplied by the token ratio pi/pi_old (with its gradient), so that on
    tokens sampled from pi_old it estimates KL(pi || pi_ref) and its gradient is that KL's.

KL estimators as loss terms (beta * k differentiated inside the loss, the tokens sampled from
pi, the gradient not flowing through the sampling): with log_r = log pi_ref/pi,
    k1 = -log_r:            grad = grad log pi, zero in expectation (E_pi grad log pi = 0):
                            it pulls nothing toward the reference, so k1 in the loss is an
                            error (k1 in the reward is fine: it shapes the advantage);
    k2 = log_r^2 / 2:       grad = (log pi/pi_ref) grad log pi, in expectation exactly the
                            gradient of the reverse KL(pi || pi_ref), although its value is a
                            biased estimate of that KL;
    k3 = e^log_r - log_r - 1: grad = (1 - pi_ref/pi) grad log pi, in expectation the gradient
                            of the *forward* KL(pi_ref || pi): close to the reverse KL's near
                            the reference, not far from it (notebook 11 measures both).
With kl.bias_correction, r k3 has expected gradient grad E_pi[k3] = grad KL(pi || pi_ref).

The policy-gradient term: one surrogate per paper, one shared signature,

    surrogate(ratio (N, T), logp (N, T), A (N, 1) or (N, T), clip: Clip) -> loss (N, T)

each a record in ``POLICY_LOSSES`` (``cfg.loss.policy``), as verl's ``core_algos`` registers
its policy losses; the KL, the entropy bonus and the aggregation are added outside it.
``ratio`` is pi_theta / pi_old from ``RATIO_LEVELS`` (per token, or GSPO's per sequence)
with its gradient. Padding is zeroed by the caller.

  * ``clip`` (PPO, Schulman et al. 2017; GRPO, DeepSeekMath eq. 3):
        -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)
    with ``dual_clip`` = c > 1, dual-clip PPO (Ye et al. 2020, "Mastering Complex Control in
    MOBA Games with Deep RL", AAAI 2020; verl's ``clip_ratio_c``): for A < 0 the loss is also
    capped at -c A, so a token whose ratio has exploded (r > c) gives a bounded loss and no
    gradient:
        A < 0:  min(-c A, -min(r A, clip(r) A))
    verl applies it always with c = 3; here it is off (``dual_clip = 0``) by default, so the
    runs recorded before it stay bit-identical, and at mu = 1 (the toy's default) r = 1 (up
    to float rounding) on every token and it can never act.
  * ``two_sided`` (INTELLECT-2, Prime Intellect 2025; TRL's ``delta``): the unclipped
    ratio is capped at ``delta`` before the min: -min(min(r, delta) A, clip(r) A). For A > 0
    the cap never binds (clip(r) <= 1 + eps_high < delta); for A < 0 it is value for value
    and gradient for gradient dual-clip with c = delta (tests/test_policy_losses.py shows
    both). INTELLECT-2 used delta = 4; no default here, the record needs delta > 1 + eps_high.
  * ``cispo`` (MiniMax-M1, MiniMax 2025): the clipped ratio becomes a stop-gradient weight
    of a REINFORCE term, so no token loses its gradient to clipping:
        -sg(clamp(r, cispo_floor, cispo_cap)) A log pi_theta
    The bounds are the weight's bounds themselves, not clip ranges: ``clip.cispo_cap`` is
    TRL's ``epsilon_high`` under ``loss_type="cispo"`` (TRL 1.16 grpo_trainer.py
    ``_compute_loss``: ``torch.clamp(coef_1, max=self.epsilon_high)``; its docs recommend 5.0,
    the default here) and verl's 1 + ``clip_ratio_high`` (verl core_algos.py
    ``compute_policy_loss_cispo``: ``torch.clamp(ratio, 1 - clip_ratio_low, 1 +
    clip_ratio_high)``); ``clip.cispo_floor`` is verl's 1 - ``clip_ratio_low`` (0 = none, as
    TRL; the paper sets its lower bound out of reach, "we did not impose a lower bound").
    eps_low and eps_high are not read by this record (a config that sets them with cispo is
    refused, naming these two). verl also clamps log r to [-20, 20] before exp
    (``clip.log_ratio_clamp 20``). The loss's *value* is the paper's objective, -w A log pi,
    so loss/total is not comparable with ``clip``'s; its gradient is -w A grad log pi. The
    paper aggregates per token (token_mean): ``method="cispo"`` sets that. The GSPO ratio
    (ratio_level="sequence") is accepted: the weight is then the clipped sequence ratio on
    every token.

The GRPO step (training/step.py) calls ``surrogate_loss``, the paper's objective without the
KL; what a step variant adds (variants.py) comes in as two arguments: ``weight`` multiplies
each token's surrogate (truncated IS, the masks of ``token_weights.py``), and each of
``terms`` is added to each token's loss before the aggregation (beta * KL_it from
``kl_term``, the entropy bonus from ``entropy_term``). ``grpo_loss`` is eq. 3 in one call, the
same pieces from the same settings blocks (``Clip``, ``KL``, ``EntropyBonus``: ``cfg.clip``,
``cfg.kl``, ``cfg.entropy_bonus``).

Inputs are checked before any arithmetic, each error naming the value. The tensors on every
call: the shapes, N = 0 or T = 0, a NaN/inf advantage, a non-finite log-prob (logp,
old_logp, ref_logp), tis_weight or entropy (the bonus's) on a real token (the search for
the first one runs only once a cheap all-finite test failed). The settings (``NUMBERS``:
eps_low in [0, 1), eps_high, the clip's other bounds; the names; max_len; the blocks' own
``check``) once: by ``surrogate_loss`` unless ``checked=True`` says a TrainConfig checked
them at construction, as the step does. Padding (mask False) may hold anything, NaN and
-inf included: it is replaced by 0 with ``torch.where`` before the arithmetic, never
multiplied by the mask (0 x NaN = NaN).
Advantages may be ints, lists or numpy arrays (ints become logp's dtype).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields
from typing import Callable

import torch

from grpo_lab.registry import check_new, check_number, lookup, register_settings


def seq_mean_token_mean(per_tok, mask, max_len):
    lengths = mask.sum(1).clamp(min=1)                                     # (N,)
    return ((per_tok * mask).sum(1) / lengths).mean()


def token_mean(per_tok, mask, max_len):
    return (per_tok * mask).sum() / mask.sum().clamp(min=1)


def dr_grpo_constant(per_tok, mask, max_len):
    return (per_tok * mask).sum() / (per_tok.shape[0] * max_len)


@dataclass(frozen=True)
class Aggregation:
    """A loss aggregation with what the step needs to know about it: ``per`` says what its
    normaliser counts, so a data-parallel step can give each rank its share of the global
    batch's loss: "rows" (completions: seq_mean_token_mean, dr_grpo) or "tokens"."""
    name: str
    fn: Callable                  # (per_tok (N, T), mask (N, T), max_len) -> scalar
    per: str = "tokens"

    def __call__(self, per_tok, mask, max_len):
        return self.fn(per_tok, mask, max_len)


AGGREGATIONS: dict[str, Aggregation] = {}


def register_aggregation(name: str, fn: Callable, per: str = "tokens") -> Aggregation:
    """Add an aggregation ``(per_tok, mask, max_len) -> loss``; ``per``: "rows" or "tokens"."""
    check_new(AGGREGATIONS, "aggregation", name, fn, lambda a: a.fn)
    if per not in ("rows", "tokens"):
        raise ValueError(f"aggregation {name!r}: per must be 'rows' or 'tokens', got {per!r}")
    AGGREGATIONS[name] = Aggregation(name, fn, per)
    return AGGREGATIONS[name]


register_aggregation("seq_mean_token_mean", seq_mean_token_mean, per="rows")
register_aggregation("token_mean", token_mean, per="tokens")
register_aggregation("dr_grpo", dr_grpo_constant, per="rows")


# ---- importance ratios: (logp, old_logp, mask) -> ratio (N, T), padding's value unused

def token_ratio(logp, old_logp, mask, clamp=0.0):
    log_r = logp - old_logp                                                # (N, T)
    if clamp:
        log_r = log_r.clamp(-clamp, clamp)                                 # verl: +-20
    return torch.exp(log_r)                                                # (N, T)


def sequence_ratio(logp, old_logp, mask, clamp=0.0):
    """GSPO (Zheng et al. 2025, eq. 7) in GSPO-token form (eq. 13): value s_i on every token."""
    lengths = mask.sum(1).clamp(min=1)                                     # (N,)
    log_s = ((logp - old_logp) * mask).sum(1) / lengths                    # (N,) mean log-ratio
    if clamp:
        log_s = log_s.clamp(-clamp, clamp)                                 # (N,)
    s = torch.exp(log_s).detach()[:, None]                                 # (N, 1) sg[s_i]
    return s * torch.exp(logp - logp.detach())                             # (N, T) = s_i, grad s_i dlogp


RATIO_LEVELS = {"token": token_ratio, "sequence": sequence_ratio}


# ---- the policy-gradient surrogates: (ratio, logp, A, Clip) -> loss (N, T)

@dataclass
class Loss:
    """Which functions make the loss: its surrogate, ratio level and aggregation (``--loss.policy
    cispo``); the numbers they read: ``clip``."""
    policy: str = "clip"
    """The policy-gradient surrogate (one of POLICY_LOSSES): "clip" (PPO/GRPO), "two_sided"
    (INTELLECT-2, needs clip.delta), "cispo" (MiniMax-M1's clipped IS weight)."""
    ratio_level: str = "token"
    """Importance ratio of the surrogate (one of RATIO_LEVELS): "token" (GRPO) or "sequence"
    (GSPO, Zheng et al. 2025: the length-normalised sequence ratio, clipped per completion;
    GSPO's paper used eps 3e-4 / 4e-4, set clip.eps_low / clip.eps_high yourself)."""
    aggregation: str = "seq_mean_token_mean"
    """How the per-token losses become one number (one of AGGREGATIONS)."""

    def check(self, cfg):
        lookup(POLICY_LOSSES, self.policy, "loss.policy")
        lookup(RATIO_LEVELS, self.ratio_level, "loss.ratio_level")
        lookup(AGGREGATIONS, self.aggregation, "loss.aggregation")
        grpo_only(cfg, "loss", self, "policy")
        if cfg.advantage == "dr_grpo" and self.aggregation != "dr_grpo":
            raise ValueError(f"advantage='dr_grpo' with loss.aggregation={self.aggregation!r} "
                             f"is half of Dr. GRPO (its 1/|o_i| stays): use method='dr_grpo', "
                             f"or advantage='mean_centred' for its advantage alone")


register_settings("loss", Loss)          # before clip: its check reads a known loss.policy


@dataclass
class Clip:
    """The clip range of the policy-gradient surrogate and the ratios' safety clamp (the
    config's ``clip`` block: ``--clip.eps_high 0.28``); the surrogates read it."""
    eps_low: float = 0.2
    """Lower clip range: ratios below 1 - eps_low stop pushing a negative advantage."""
    eps_high: float = 0.28
    """Upper clip range (DAPO's clip-higher uses 0.28 > 0.2)."""
    dual_clip: float = 0.0
    """Dual-clip PPO (Ye et al. 2020): c > 1 caps the loss of an A < 0 token at -c A, so an
    exploded ratio gives a bounded loss and no gradient (verl: 3; 0 = off, the default: at
    mu = 1 every ratio is 1 up to rounding, so it cannot act, and recorded runs stay
    bit-identical). loss.policy="clip" only."""
    delta: float = 0.0
    """loss.policy="two_sided": the cap delta > 1 + eps_high on the unclipped ratio
    (INTELLECT-2: 4); the same bound as dual_clip = delta."""
    log_ratio_clamp: float = 0.0
    """Clamp log(pi/pi_old) and log(pi_ref/pi) to [-c, c] before exp (verl: 20; 0 = off, the
    default: e^20 = 4.9e8, never reached near the policy, so off changes nothing there)."""
    cispo_cap: float = 5.0
    """loss.policy="cispo": the cap on its IS weight, the cap itself: w = min(r, cispo_cap).
    TRL's epsilon_high under loss_type="cispo" is this number (its docs recommend 5.0);
    verl's clip_ratio_high = h is cispo_cap = 1 + h."""
    cispo_floor: float = 0.0
    """loss.policy="cispo": the lower bound of its IS weight, w = max(r, cispo_floor); 0 = none
    (TRL; the paper). verl's compute_policy_loss_cispo clamps from below at 1 - clip_ratio_low
    (0.8 at its default 0.2): cispo_floor = 1 - l."""

    def check(self, cfg):
        check_clip(cfg.loss.policy, self)
        if cfg.loss.policy == "cispo":
            for f in fields(self):
                if f.name in ("eps_low", "eps_high") and getattr(self, f.name) != f.default:
                    raise ValueError(
                        f"clip.{f.name}={getattr(self, f.name)} is not read by loss.policy="
                        f"'cispo': its IS weight is clamped to [clip.cispo_floor, "
                        f"clip.cispo_cap], the bounds themselves (TRL's epsilon_high for "
                        f"loss_type='cispo' is clip.cispo_cap; verl's clip_ratio_high h and "
                        f"clip_ratio_low l are clip.cispo_cap = 1 + h, clip.cispo_floor = 1 - l)")
        grpo_only(cfg, "clip", self, "dual_clip", "delta", "log_ratio_clamp", "cispo_cap",
                  "cispo_floor")


register_settings("clip", Clip)


def clip_loss(ratio, logp, A, clip: Clip):
    clipped = ratio.clamp(1 - clip.eps_low, 1 + clip.eps_high)             # (N, T)
    loss = -torch.min(ratio * A, clipped * A)                              # (N, T) PPO eq. 7
    if clip.dual_clip:
        bound = -clip.dual_clip * A                                        # (N, 1) or (N, T)
        loss = torch.where(A < 0, torch.min(loss, bound), loss)            # Ye et al. 2020
    return loss


def two_sided_loss(ratio, logp, A, clip: Clip):
    capped = ratio.clamp(max=clip.delta)                                   # (N, T) min(r, delta)
    clipped = ratio.clamp(1 - clip.eps_low, 1 + clip.eps_high)             # (N, T)
    return -torch.min(capped * A, clipped * A)                             # (N, T) INTELLECT-2


def cispo_loss(ratio, logp, A, clip: Clip):
    w = ratio.clamp(clip.cispo_floor, clip.cispo_cap).detach()             # (N, T) sg(clip(r))
    return -w * A * logp                                                   # (N, T) MiniMax-M1


@dataclass(frozen=True)
class PolicyLoss:
    """One surrogate with what the config checks about it."""
    name: str
    fn: Callable                  # (ratio, logp, A, Clip) -> per-token loss (N, T)
    paper: str
    changes: str                  # one line: what it changes against GRPO's clip
    needs: tuple = ()             # Clip fields that must be set (> 0) for it

    def __call__(self, ratio, logp, A, clip: Clip):
        return self.fn(ratio, logp, A, clip)


POLICY_LOSSES: dict[str, PolicyLoss] = {}


def register_policy_loss(name: str, fn: Callable, paper: str = "", changes: str = "",
                         needs: tuple = ()) -> PolicyLoss:
    """Add a surrogate ``(ratio, logp, A, Clip) -> (N, T)`` (``--loss.policy NAME``)."""
    check_new(POLICY_LOSSES, "policy loss", name, fn, lambda p: p.fn)
    POLICY_LOSSES[name] = PolicyLoss(name, fn, paper, changes, tuple(needs))
    return POLICY_LOSSES[name]


register_policy_loss("clip", clip_loss, "PPO (Schulman et al. 2017); GRPO (Shao et al. 2024)",
                     "the clipped surrogate; dual_clip > 1 adds dual-clip PPO (Ye et al. 2020)")
register_policy_loss("two_sided", two_sided_loss, "INTELLECT-2 (Prime Intellect 2025)",
                     "caps the unclipped ratio at delta: bounds A < 0 tokens whose ratio exploded",
                     needs=("delta",))
register_policy_loss("cispo", cispo_loss, "MiniMax-M1 (MiniMax 2025)",
                     "sg(clamp(r, cispo_floor, cispo_cap)) A log pi: a clipped IS weight, no "
                     "token's gradient clipped away")


def check_clip(name: str, clip: Clip) -> Clip:
    """Raise ValueError on a Clip the surrogate ``name`` cannot use, saying why -> the Clip
    with floats."""
    clip = Clip(*_numbers(**{f.name: getattr(clip, f.name) for f in fields(Clip)}))
    for field, reader, hint in (("dual_clip", "clip", " (two_sided's delta is the same bound)"),
                                ("delta", "two_sided", ""),
                                ("cispo_floor", "cispo", "")):             # its one reader
        if getattr(clip, field) and name != reader:
            raise ValueError(f"clip.{field} is read only by loss.policy={reader!r}; {name!r} "
                             f"does not read it{hint}")
    if clip.cispo_cap != Clip.cispo_cap and name != "cispo":
        raise ValueError(f"clip.cispo_cap is read only by loss.policy='cispo'; {name!r} does "
                         f"not read it (its clip range is clip.eps_low / clip.eps_high)")
    if name == "cispo" and not clip.cispo_floor < clip.cispo_cap:
        raise ValueError(f"loss.policy='cispo' needs clip.cispo_floor < clip.cispo_cap, got "
                         f"floor {clip.cispo_floor} and cap {clip.cispo_cap}")
    if "delta" in POLICY_LOSSES[name].needs and not clip.delta > 1 + clip.eps_high:
        raise ValueError(f"loss.policy={name!r} needs clip.delta > 1 + clip.eps_high = "
                         f"{1 + clip.eps_high} (below it the cap binds on A > 0 tokens too), "
                         f"got {clip.delta}")
    return clip


# ---- KL estimators (Schulman 2020): log_r = log pi_ref/pi on tokens sampled from pi

@dataclass(frozen=True)
class KLEstimator:
    """One estimator of KL(pi || pi_ref) from a token sampled from pi, with its properties."""
    name: str
    fn: Callable                  # log_r (...) -> estimate (...)
    unbiased: bool                # E_pi[estimate] = KL(pi || pi_ref)
    nonnegative: bool             # >= 0 on every sample
    loss_gradient: str = ""       # what its gradient is in expectation, as a loss term
    in_loss: bool = True          # False: as a loss term its expected gradient is 0

    def __call__(self, log_r):
        return self.fn(log_r)


KL_ESTIMATORS = {e.name: e for e in (
    KLEstimator("k1", lambda d: -d, unbiased=True, nonnegative=False,     # log pi/pi_ref
                loss_gradient="0 in expectation (E_pi grad log pi = 0)", in_loss=False),
    KLEstimator("k2", lambda d: 0.5 * d ** 2, unbiased=False, nonnegative=True,
                loss_gradient="grad KL(pi || pi_ref), the reverse KL, exactly"),
    KLEstimator("k3", lambda d: torch.exp(d) - d - 1, unbiased=True, nonnegative=True,
                loss_gradient="grad KL(pi_ref || pi), the forward KL"),
)}


@dataclass(frozen=True)
class KLPlacement:
    """Where beta * KL goes: into the loss (DeepSeekMath, a per-token term with a gradient) or
    into the reward (InstructGPT-style: beta * the completion's summed KL estimate, taken on
    the sampler's log-probs, is subtracted from its reward before the advantages)."""
    name: str
    in_loss: bool
    in_reward: bool


KL_PLACEMENTS = {p.name: p for p in (KLPlacement("loss", True, False),
                                     KLPlacement("reward", False, True))}


@dataclass
class KL:
    """The KL penalty to the frozen reference policy (DeepSeekMath eq. 3, 4; loss.py):
    ``--kl.beta 0.04``, ``{"kl": {"beta": 0.04}}``."""
    beta: float = 0.02
    """Weight of the KL penalty to the reference policy (0 skips the reference forward)."""
    estimator: str = "k3"
    """How the KL to the reference is estimated from sampled tokens (one of
    loss.KL_ESTIMATORS, Schulman 2020): "k1" log pi/pi_ref (unbiased, can be negative; as a
    loss term its expected gradient is 0, so placement="loss" with k1 is refused), "k2"
    (log pi/pi_ref)^2 / 2 (biased, >= 0; in the loss, the reverse KL's exact gradient), "k3"
    the paper's (unbiased, >= 0; in the loss, the forward KL's gradient)."""
    placement: str = "loss"
    """Where beta * KL goes (one of loss.KL_PLACEMENTS): "loss", a per-token term of the loss
    (DeepSeekMath; logged as loss/kl and loss/kl_<estimator>), or "reward", the completion's
    summed estimate subtracted from its reward before the advantages (logged as
    reward/kl_<estimator>)."""
    clamp: float = 0.0
    """Clamp each token's KL estimate in the loss to [-c, c] (verl: 10 on k3; 0 = off)."""
    bias_correction: bool = False
    """Multiply each token's KL estimate by pi/pi_old (DeepSeek-V3.2; TRL's
    use_bias_correction_kl): an estimate of KL(pi || pi_ref) from tokens sampled by pi_old,
    whose gradient is that KL's (k3 alone gives the forward KL's)."""

    def in_loss(self) -> bool:
        """beta * KL_it is a term of the loss (the step's kl_loss variant is on)."""
        return bool(self.beta) and KL_PLACEMENTS[self.placement].in_loss

    def check(self, cfg=None):
        """cfg None: the block alone (grpo_loss), without the checks against the objective."""
        check_number("kl.beta", self.beta)
        check_number("kl.clamp", self.clamp, what="0 (off) or a finite bound > 0")
        lookup(KL_ESTIMATORS, self.estimator, "kl.estimator")
        lookup(KL_PLACEMENTS, self.placement, "kl.placement")
        if self.in_loss():
            check_kl_in_loss(self.estimator, self.beta)
        for name in ("clamp", "bias_correction"):
            if getattr(self, name) and not self.in_loss():
                raise ValueError(f"kl.{name}={getattr(self, name)!r} acts on the KL term of the "
                                 f"loss; with kl.beta={self.beta} and kl.placement="
                                 f"{self.placement!r} there is none")
        grpo_only(cfg, "kl", self, "clamp", "bias_correction")


@dataclass
class EntropyBonus:
    """An entropy bonus in each token's loss: ``--entropy_bonus.coef 0.01``."""
    coef: float = 0.0
    """coef * the policy's token entropy is subtracted from each token's loss, aggregated like
    the loss (0 = off). policy/entropy is logged either way."""

    def check(self, cfg=None):
        check_number("entropy_bonus.coef", self.coef)


def grpo_only(cfg, block: str, settings, *names) -> None:
    """The fields ``names`` of a block are read by the grpo objective only: an error naming the
    first one set (not its default) when ``cfg.objective`` is another (cfg None: none)."""
    if cfg is None or cfg.objective == "grpo":
        return
    for f in fields(settings):
        if f.name in names and getattr(settings, f.name) != f.default:
            raise ValueError(f"{block}.{f.name}={getattr(settings, f.name)!r} is read by the grpo "
                             f"objective only, not objective={cfg.objective!r}")


def sequence_kl(logp, ref_logp, mask, estimator: str = "k3") -> torch.Tensor:
    """(N, T) log-probs of the sampled tokens -> (N,) summed KL estimate per completion."""
    k = lookup(KL_ESTIMATORS, estimator, "kl.estimator")
    if not (logp.dim() == 2 and logp.shape == ref_logp.shape == mask.shape):   # no broadcast
        raise ValueError(f"logp, ref_logp and mask must be one (N, T) shape, got "
                         f"{tuple(logp.shape)}, {tuple(ref_logp.shape)} and {tuple(mask.shape)}")
    d = torch.where(mask.bool(), ref_logp - logp, 0.0)                     # (N, T) log_r, pad 0
    if not torch.isfinite(d).all():              # a NaN sum otherwise: name the token
        for name, x in (("logp", logp), ("ref_logp", ref_logp)):
            _first_non_finite(name, x, mask.bool())
    return (k(d) * mask).sum(1)                                            # (N,) every k(0) = 0


def surrogate_loss(logp, old_logp, advantages, mask, clip: Clip = Clip(eps_high=0.2),
                   aggregation="seq_mean_token_mean", max_len=None, ratio_level="token",
                   policy_loss="clip", weight=None, terms=(), *, checked=False):
    """-> (loss, stats): -J without the KL, the ``policy_loss`` surrogate of the ``ratio_level``
    ratio, aggregated. logp, old_logp, mask, ``weight`` (detached): (N, T); advantages: (N,) or
    (N, T); ``max_len``: dr_grpo's constant (default T); ``terms``: ``(logp, old_logp, real) ->
    ((N, T), stats)``, given padding 0; ``checked``: the settings were checked already."""
    if not checked:
        clip = _check_settings(clip, aggregation, max_len, ratio_level, policy_loss)
    A, real = _check_tensors(logp, old_logp, advantages, mask, weight)  # real (N, T): tokens
    logp, old_logp = (torch.where(real, x, 0.0) for x in (logp, old_logp))  # (N, T) padding 0
    mask = mask.to(logp.dtype)
    A = A[:, None] if A.dim() == 1 else torch.where(real, A, 0.0)          # (N, 1) or (N, T)
    ratio = RATIO_LEVELS[ratio_level](logp, old_logp, mask, clip.log_ratio_clamp)  # (N, T)
    per_tok = POLICY_LOSSES[policy_loss].fn(ratio, logp, A, clip)          # (N, T)
    if weight is not None:
        per_tok = per_tok * torch.where(real, weight, 0.0).detach()        # (N, T) TIS, masks
    added = {}
    for term in terms:
        x, s = term(logp, old_logp, real)                                  # (N, T)
        per_tok, added = per_tok + x, {**added, **s}
    loss = AGGREGATIONS[aggregation].fn(per_tok, mask, max_len or logp.shape[1])
    with torch.no_grad():
        n_tok = mask.sum().clamp(min=1)
        lo, hi = ((clip.cispo_floor, clip.cispo_cap) if policy_loss == "cispo"   # the weight's
                  else (1 - clip.eps_low, 1 + clip.eps_high))                  # bounds, or the range
        frac = lambda hit: float((hit.to(mask.dtype) * mask).sum() / n_tok)  # noqa: E731
        stats = {"loss/total": float(loss),
                 "clip/low_frac": frac((ratio < lo) & (A < 0)),                   # clipped below
                 "clip/high_frac": frac((ratio > hi) & (A > 0)),                  # clipped above
                 "clip/ratio_mean": float((ratio * mask).sum() / n_tok)}
        if clip.dual_clip:                 # tokens whose loss the dual-clip bound -c A replaced
            stats["clip/dual_frac"] = frac((ratio > clip.dual_clip) & (A < 0))
    return loss, {**stats, **added}


def kl_term(logp, old_logp, ref_logp, real, kl: KL, log_ratio_clamp=0.0):
    """logp, old_logp (padding 0), ref_logp: (N, T) -> (beta * KL_it (N, T) with its gradient,
    eq. 4 for k3; loss/kl and loss/kl_<estimator>: KL_it's mean over the real tokens), a term
    of ``surrogate_loss``; ``kl``: the KL block (beta, estimator, clamp, bias_correction; the
    clamps and the bias correction: the module docstring)."""
    d = torch.where(real, ref_logp, 0.0) - logp                            # (N, T) log(pi_ref/pi)
    if not torch.isfinite(d).all():                # logp is finite: ref_logp is not
        _first_non_finite("ref_logp", ref_logp, real)
    if log_ratio_clamp:
        d = d.clamp(-log_ratio_clamp, log_ratio_clamp)                     # verl: +-20
    k = KL_ESTIMATORS[kl.estimator].fn(d)                                  # (N, T) k3: eq. 4
    if kl.clamp:
        k = k.clamp(-kl.clamp, kl.clamp)                                   # verl: +-10
    if kl.bias_correction:
        k = k * torch.exp(logp - old_logp)                                 # (N, T) DeepSeek-V3.2
    m = real.to(logp.dtype)
    mean = float((k.detach() * m).sum() / m.sum().clamp(min=1))
    return kl.beta * k, {"loss/kl": mean, f"loss/kl_{kl.estimator}": mean}


def entropy_term(entropy, real, bonus: EntropyBonus):
    """entropy (N, T) with its graph -> (-coef * H_it (N, T), padding 0; no stats), a term of
    ``surrogate_loss``: the entropy bonus."""
    h = torch.where(real, entropy, 0.0)                                    # (N, T) padding 0
    if not torch.isfinite(h).all():
        _first_non_finite("entropy", entropy.detach(), real)
    return -bonus.coef * h, {}


def grpo_loss(logp, old_logp, advantages, mask, clip: Clip = Clip(eps_high=0.2),
              kl: KL = KL(beta=0.0), entropy_bonus: EntropyBonus = EntropyBonus(),
              aggregation="seq_mean_token_mean", max_len=None, ratio_level="token",
              policy_loss="clip", *, ref_logp=None, entropy=None, tis_weight=None, keep=None):
    """-> (loss, stats): DeepSeekMath eq. 3 in one call (notebooks, exercises, ppo.py), composed
    as the step does: ``surrogate_loss`` with the config's blocks and the kl_loss and
    entropy_bonus variants' terms. logp, old_logp, mask: (N, T); advantages: (N,) or (N, T);
    the default clip: the paper's, eps 0.2 both sides. ``ref_logp`` (N, T) is read when
    ``kl.in_loss()``, else stats has no "loss/kl" nor "loss/kl_<estimator>" (absent, not 0);
    ``entropy`` (N, T), with its graph, when entropy_bonus.coef != 0; ``tis_weight`` (N, T)
    multiplies the policy-gradient term; ``keep`` (N,) bool drops rows."""
    kl.check(), entropy_bonus.check()
    if keep is not None:
        keep = torch.as_tensor(keep, dtype=torch.bool, device=logp.device)
        if keep.shape != logp.shape[:1]:
            raise ValueError(f"keep {tuple(keep.shape)} must be (N,) = ({logp.shape[0]},)")
        rows = lambda x: x if x is None or not torch.is_tensor(x) or x.dim() == 0 else x[keep]  # noqa: E731
        logp, old_logp, ref_logp, mask, entropy, tis_weight = (
            rows(x) for x in (logp, old_logp, ref_logp, mask, entropy, tis_weight))
        advantages = rows(torch.as_tensor(advantages))
    for on, setting, name, x in ((kl.in_loss(), f"kl.beta={kl.beta}", "ref_logp", ref_logp),
                                 (entropy_bonus.coef != 0, f"entropy_bonus.coef="
                                  f"{entropy_bonus.coef}", "entropy", entropy)):
        if on and (x is None or x.shape != logp.shape):
            raise ValueError(f"{setting} needs {name} of the same (N, T) shape as logp")
    terms = []
    if kl.in_loss():
        terms.append(lambda lp, old, real: kl_term(lp, old, ref_logp, real, kl, clip.log_ratio_clamp))
    if entropy_bonus.coef != 0:
        terms.append(lambda lp, old, real: entropy_term(entropy, real, entropy_bonus))
    return surrogate_loss(logp, old_logp, advantages, mask, clip, aggregation, max_len,
                          ratio_level, policy_loss, tis_weight, terms)


def _check_settings(clip, aggregation, max_len, ratio_level, policy_loss):
    """Raise ValueError naming the first bad setting of surrogate_loss -> clip as floats."""
    lookup(AGGREGATIONS, aggregation, "aggregation")
    lookup(RATIO_LEVELS, ratio_level, "ratio_level")
    lookup(POLICY_LOSSES, policy_loss, "policy_loss")
    if max_len is not None and not (isinstance(max_len, numbers.Integral) and max_len > 0):
        raise ValueError(f"max_len must be a positive int (the dr_grpo normaliser), "
                         f"got {max_len!r}")
    return check_clip(policy_loss, clip)


def _check_tensors(logp, old_logp, advantages, mask, weight):
    """Raise ValueError naming the first bad shape or non-finite value on a real token ->
    (advantages as a floating tensor, the real tokens: mask as bool (N, T))."""
    A = torch.as_tensor(advantages, device=logp.device)                   # lists, numpy
    A = A if A.is_floating_point() else A.to(logp.dtype)                   # ints, bools -> float
    NT = logp.shape if logp.dim() == 2 else None                           # (N, T)
    for name, x, ok in (("old_logp", old_logp, [NT]), ("mask", mask, [NT]),
                        ("tis_weight", weight, [NT]), ("advantages", A, [NT, logp.shape[:1]])):
        if x is not None and x.shape not in ok:
            raise ValueError(f"logp, old_logp, mask and tis_weight must be one (N, T) shape, "
                             f"advantages (N,) or (N, T): logp has {tuple(logp.shape)}, "
                             f"{name} {tuple(x.shape)}")
    if 0 in logp.shape:
        raise ValueError(f"no completions to score: logp has shape {tuple(logp.shape)} "
                         f"(N = 0 or T = 0)")
    real = mask.bool()                                                     # (N, T)
    for name, x in (("advantage", A), ("logp", logp.detach()), ("old_logp", old_logp),
                    ("tis_weight", weight)):                               # weight may be None
        on = real if x is None or x.dim() == 2 else torch.ones_like(x, dtype=torch.bool)
        if x is not None and not (torch.isfinite(x) | ~on).all():       # (N, T) or (N,)
            _first_non_finite(name, x, on)
    return A, real


def check_kl_in_loss(kl_estimator: str, beta) -> None:
    """k1 as a loss term has zero expected gradient: an error that says so."""
    if beta and not KL_ESTIMATORS[kl_estimator].in_loss:
        raise ValueError(f"kl_estimator={kl_estimator!r} as a loss term does nothing: its "
                         f"gradient is {KL_ESTIMATORS[kl_estimator].loss_gradient}, so beta="
                         f"{float(beta)} pulls nothing toward the reference; use k3 or k2 in "
                         f"the loss, or put k1 in the reward (kl.placement='reward')")


# what each number argument must be: name -> (test of its float, what the error says); every
# test is False for NaN, and 0 <= x < inf for inf too
_BOUND = (lambda x: 0 <= x < math.inf, "0 (off) or a finite bound > 0")
NUMBERS = {
    "eps_low": (lambda x: 0 <= x < 1, "finite and in [0, 1)"),
    "eps_high": (lambda x: 0 <= x < math.inf, "finite and >= 0"), "log_ratio_clamp": _BOUND,
    "dual_clip": (lambda x: x == 0 or x > 1, "0 (off) or > 1 (a bound c <= 1 would cap the "
                  "loss of on-policy tokens, ratio 1, with A < 0)"),
    "delta": (_BOUND[0], "0 (off) or a finite cap > 1 + eps_high"),
    "cispo_cap": (lambda x: 0 < x < math.inf, "a finite cap > 0 (TRL recommends 5.0)"),
    "cispo_floor": (lambda x: 0 <= x < math.inf, "0 (none) or a finite bound > 0 (verl: "
                    "1 - clip_ratio_low = 0.8)"),
}


def _numbers(**values) -> list[float]:
    """Raise ValueError naming the first value that is not a number within its ``NUMBERS``
    range -> the values as floats."""
    for name, v in values.items():
        if not (isinstance(v, numbers.Real) or torch.is_tensor(v) and v.numel() == 1):
            raise ValueError(f"{name} must be a number, got {v!r}")
        if not NUMBERS[name][0](float(v)):
            raise ValueError(f"{name} must be {NUMBERS[name][1]}, got {float(v)}")
    return [float(v) for v in values.values()]


def _first_non_finite(name: str, x: torch.Tensor, where: torch.Tensor) -> None:
    """Raise naming the first non-finite entry of ``x`` among the ``where`` positions (called
    once a check found one, so the search runs on the failure path only)."""
    bad = (where & ~torch.isfinite(x)).nonzero()                           # (n_bad, x.dim())
    if len(bad):
        pos = tuple(bad[0].tolist())
        at = f"sample {pos[0]}" if len(pos) == 1 else f"sample {pos[0]}, token {pos[1]}"
        raise ValueError(f"{name} of {at} is {float(x[pos])} "
                         f"({len(bad)} non-finite {name} values in all)")
