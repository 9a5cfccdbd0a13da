"""SmolLM2's numbers as digests, to show that a refactor changes none of them on the real model.

    python tools/same_tokens.py --out A.json        (before; again into B.json after)
    python tools/same_tokens.py --compare A.json B.json

tools/same_metrics.py covers the toy and the tiny HF model; this one loads SmolLM2-135M-Instruct
from the model cache (``grpo-lab model get smollm2-135m``) and, for float32 sampling, bf16
sampling (``sample_dtype``) and LoRA (r 4, its B matrices drawn non-zero so the adapters act),
samples 4 completions of 24 tokens for each of 3 chat prompts (one seeded generator per
prompt), recomputes their log-probs with the update's forward and takes one backward. It writes
sha256 digests of the tokens, the sampler's log-probs and the update's log-probs, and the
gradient norm in full (``repr``). ``--compare`` exits 1 at the first difference. Two threads,
about a minute.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys

PROMPTS = ["What is 17 + 25?", "Reverse the word 'cab'.", "Name a prime above 90."]
SETTINGS = {"fp32": {}, "bf16_sampling": {"sample_dtype": "bfloat16"},
            "lora": {"lora_r": 4, "lora_alpha": 8}}


def fingerprints() -> dict:
    import torch
    from grpo_lab.algorithm.rollout import completion_logprobs, sample
    from grpo_lab.models import resolve
    from grpo_lab.policies.hf import load_hf_policy

    torch.set_num_threads(2)
    digest = lambda t: hashlib.sha256(t.detach().numpy().tobytes()).hexdigest()  # noqa: E731
    out = {}
    for name, settings in SETTINGS.items():
        policy = load_hf_policy(resolve("smollm2-135m"), chat_template=True, **settings)
        torch.manual_seed(0)
        for n, p in policy.named_parameters():
            if "lora_B" in n:                        # peft starts B at 0: the adapters would add 0
                p.data.normal_(0, 0.01)
        ids = [policy.encode(p) for p in PROMPTS]
        r = sample(policy, ids, 4, 24, generator=[torch.Generator().manual_seed(i)
                                                  for i in range(len(ids))])
        logp = completion_logprobs(policy, r)
        (-(logp * r.completion_mask).sum()).backward()
        grad = sum(float(p.grad.double().norm() ** 2) for p in policy.parameters()
                   if p.grad is not None) ** 0.5
        out[name] = {"tokens": digest(r.completion_ids), "sampler_logprobs": digest(r.logprobs),
                     "update_logprobs": digest(logp), "grad_norm": repr(grad)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"))
    args = ap.parse_args()
    if args.compare:
        a, b = (json.loads(open(p).read()) for p in args.compare)
        for name in a.keys() | b.keys():
            for key in (a.get(name, {}).keys() | b.get(name, {}).keys()):
                if a.get(name, {}).get(key) != b.get(name, {}).get(key):
                    print(f"{name}: {key} differs")
                    return 1
        print(f"same: {', '.join(sorted(a))}")
        return 0
    out = fingerprints()
    text = json.dumps(out, indent=1)
    if args.out:
        open(args.out, "w").write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
