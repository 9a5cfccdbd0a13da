"""A run's saved config (``out_dir/config.json``, ``config.to_dict``'s output) read again:
``upgrade_saved`` says an older config in today's names (``config.from_dict`` reads through
it), ``config_changes`` lists what a resumed run changes (trainer's resume check), the
``RUNTIME_FIELDS`` left out. Plain dicts only: config.py imports this module.
"""
from __future__ import annotations

# fields a resumed run may change freely: how it runs, not what it computes
RUNTIME_FIELDS = ("out_dir", "report_to", "threads", "speed.rollout_threads", "speed.device",
                  "time_budget_s", "target_accuracy",
                  "ckpt_format",
                  "exchange.timeout_s", "user_code_timeout_s",
                  "exchange.overlap")  # overlap changes when bytes move, not what is computed


def upgrade_saved(d: dict) -> dict:
    """A saved config written before a name changed its meaning -> the same run in today's
    names, or an error where today's names cannot say it: CISPO's cap was 1 + clip.eps_high
    (a saved clip block without cispo_cap), now clip.cispo_cap itself (its eps_low, read by no
    cispo loss then either, is dropped: cispo refuses it now); tis.level
    "sequence_mask" was the geometric-mean rejection with the rejected tokens kept in the
    normaliser (a saved tis block without floor), now TRL's sequence_mask."""
    clip, tis = d.get("clip"), d.get("tis")
    cispo = (d.get("loss") or {}).get("policy") == "cispo"
    if cispo and isinstance(clip, dict) and "cispo_cap" not in clip:
        clip = {k: v for k, v in clip.items() if k not in ("eps_low", "eps_high")}
        d = {**d, "clip": {**clip, "cispo_cap": 1 + d["clip"].get("eps_high", 0.28)}}
    if isinstance(tis, dict) and tis.get("level") == "sequence_mask" and "floor" not in tis:
        raise ValueError("this run's config was saved when tis.level='sequence_mask' meant the "
                         "geometric-mean rejection with the rejected tokens kept in the "
                         "normaliser; that name is now TRL's sequence_mask (the product of the "
                         "ratios, kept where it lies in [tis.floor, tis.cap]) and the rejection "
                         "is verl's seq_mean_k1 (rejected tokens out of the normaliser): set "
                         "tis.level to one of them in the saved config (docs/guide/methods.md)")
    return d


def config_changes(saved: dict, given: dict) -> dict:
    """{field: [saved value, given value]} for every field of ``given`` (a config's
    ``to_dict``) that differs from the saved config (read in today's names,
    ``upgrade_saved``; sub-configs dotted: "exchange.name"), runtime fields left out."""
    saved, out = upgrade_saved(saved), {}
    for k, v in given.items():
        if isinstance(v, dict) and k != "reward_weights":
            for sk, sv in v.items():
                old = (saved.get(k) or {}).get(sk, sv)
                if old != sv and f"{k}.{sk}" not in RUNTIME_FIELDS:
                    out[f"{k}.{sk}"] = [old, sv]
        elif k in saved and saved[k] != v and k not in RUNTIME_FIELDS:
            out[k] = [saved[k], v]
    return out
