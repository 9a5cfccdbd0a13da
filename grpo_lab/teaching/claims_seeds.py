"""The five write-ups the claims table answers, claim by claim: ``SEEDS``, one record per
checkable claim, numbered by write-up and claim in reading order (write-up 000's third claim is
"0.3"), with the row(s) of ``claims.CLAIMS`` that settle it.

The write-ups are five Chinese articles about "GRPO" (the project's first list, CLAIMS.md,
quoted a selection of them). What counts as one checkable claim: a statement a reader could find
true or false (a figure, a formula, a definition, a hardware or paper fact) that the write-up
asserts as its own; several figures from one experiment in one sentence are one claim, unless
the table judges them apart (the baseline's 120 TFLOPS beside 145 and 98; 1.2 PFLOPS beside 3.7x).
Not counted (``NOT_COUNTED``): advice and recipes (hardware to buy, monitoring targets, step
counts to re-cluster at, a pip line), plans for the future, background facts about other models,
and sentences with nothing to be true or false about ("captures local optima", "explicitly
models similarity"). ``note`` says which part of a claim its row leaves unmeasured.
"""
from __future__ import annotations

from typing import NamedTuple


class SeedClaim(NamedTuple):
    id: str            # "<write-up>.<claim in reading order>"
    words: str         # the claim, in short
    rows: tuple        # numbers of claims.CLAIMS that settle it
    note: str = ""     # what its rows leave unmeasured, if anything


WRITE_UPS = {"0": "000 'GRPO (Gradient Resource-aware Parallel Optimization): the key to the resource bottleneck'",
             "1": "001 'GRPO (Group Relative Policy Optimization): why it saves energy'",
             "2": "002 'GRPO (Gradient Recalculation and Parallel Orchestration)'",
             "3": "003 'GRPO: the key engine behind DeepSeek'",
             "4": "004 'Building a large model from zero: DeepSeek's GRPO'"}

S = SeedClaim
SEEDS = (
    S("0.1", "a 175B model's activations and gradients take 1.2 TB, held by 8 x A100 80 GB", (28,)),
    S("0.2", "All-Reduce takes 35% of the training time", (41,)),
    S("0.3", "on 1024 cards its latency reaches seconds", (5,)),
    S("0.4", "data-parallel utilization per card is only 62%", (41,)),
    S("0.5", "ZeRO cuts memory to 1/N but brings N-fold communication", (26,)),
    S("0.6", "activation checkpointing costs 20% redundant compute", (27,)),
    S("0.7", "GRPO = Gradient Resource-aware Parallel Optimization", (25,)),
    S("0.8", "gradient importance = 0.7 var(history) + 0.3 ||grad||", (38,)),
    S("0.9", "importance sharding: key gradients computed locally 3x more, communication -58%", (1,)),
    S("0.10", "FP8 on the top-20% gradients, error < 0.3%", (2,)),
    S("0.11", "Top-K 5% + Huffman-coded indices: 8:1", (3,)),
    S("0.12", "gradient traffic 1.2 TB -> 280 GB at unchanged convergence", (4,)),
    S("0.13", "ring All-Reduce latency is O(N)", (5,)),
    S("0.14", "METIS partitioning + ordered sends: 1.2 s -> 420 ms at 1024 cards, comm:compute 1.76:1 -> 0.62:1", (5,)),
    S("0.15", "memory: FP32 2800 GB, ZeRO-3 700 GB, GRPO 375 GB (-47%)", (6,)),
    S("0.16", "256 A100s, 13B model: baseline throughput 120 TFLOPS per card", (7,),
      "not measured (no GPU here): the row states it"),
    S("0.17", "ZeRO-3 98, GRPO 145 TFLOPS per card", (7,)),
    S("0.18", "82% compute-communication overlap", (7,)),
    S("0.19", "WikiText-103: 12% fewer steps to PPL 18.5, final accuracy within 0.3%", (8,)),
    S("0.20", "H100 with NVLink 3.0, 900 GB/s", (35,)),
    S("0.21", "activation checkpoint interval = sqrt(batch size)", (9,)),
    S("0.22", "Meta's experiment: 1.2 PFLOPS per card sustained", (31,)),
    S("0.23", "3.7x the traditional scheme", (31,), "not measured (no scheme named): the row states it"),
    S("0.24", "cluster size -40% for a trillion-parameter model, over ten million dollars a year saved", (42,)),
    S("1.1", "GRPO = Group Relative Policy Optimization", (34,)),
    S("1.2", "grad J ~ E[(R_i - mean R_g) grad log pi(a_i|s_i)]", (32,)),
    S("1.3", "PPO's computation grows with the batch; GRPO, comparing within groups, computes much less", (11,)),
    S("1.4", "a batch's sentences grouped by topic and compared within their topic", (23,)),
    S("1.5", "samples needed -50% to -70% against PPO", (10,)),
    S("1.6", "gradient complexity O(N) -> O(N/G)", (11,)),
    S("1.7", "groups spread over devices: resource utilization +30%", (43,)),
    S("1.8", "dynamic group count, 5 early to 20 late, avoids local optima", (12,)),
    S("1.9", "members of a group share state (a common prefix), saving storage", (13,)),
    S("1.10", "long texts grouped by paragraph get local rewards as they are generated", (34, 40),
      "what a group is (row 34: G completions of one prompt, rewarded whole); no time saving measured"),
    S("1.11", "a code model's training 72 h -> 48 h, resources -33%", (14,)),
    S("1.12", "multi-task grouping by task: less negative transfer, utilization +25%", (44,)),
    S("1.13", "a mobile NLP model: memory 2 GB -> 1.2 GB, training +40% faster", (14,)),
    S("1.14", "group count raised 20% per round", (12,)),
    S("1.15", "a group mixing high- and low-quality samples may mislead the policy", (40,)),
    S("2.1", "GRPO = Gradient Recalculation and Parallel Orchestration", (25,)),
    S("2.2", "activations saved only at key nodes, the rest recomputed (memory otherwise linear in depth)", (15, 9),
      "what checkpointing is and what it saves; the linear growth with depth is not measured separately"),
    S("2.3", "recomputation: memory -30% to -50%", (15,)),
    S("2.4", "dynamic parallel orchestration: utilization +20%, communication -15%", (45,)),
    S("2.5", "gradient checkpointing -40% memory; 175B 320 GB -> 190 GB", (15,)),
    S("2.6", "FP16 locally + 8-bit across nodes: bandwidth -60%, latency -25%", (16,),
      "latency -25% not measured (no link named): the row states it"),
    S("2.7", "removing duplicate operators: -15% to -20% FLOPs", (46,)),
    S("2.8", "a thousand-card GPT-3 run: epoch 8.2 h -> 5.7 h, memory 48 -> 29 GB, traffic 320 -> 135 GB/h", (17,)),
    S("2.9", "one training run's cost -40% or more", (47,)),
    S("2.10", "an ICML 2023 paper, 'GRPO: Memory-Efficient Large-Scale Training via Gradient Recomputation ...'", (17,)),
    S("3.1", "DeepSeek is a deep-learning framework whose core is GRPO", (36,)),
    S("3.2", "GRPO = Gradient-based Resource-aware Policy Optimization", (25,)),
    S("3.3", "column sharding of W: gradient complexity O(mn) -> O(mn/k)", (18,)),
    S("3.4", "HPM = alpha FLOPS + beta bandwidth - gamma latency", (38,)),
    S("3.5", "the policy network trained with PPO's clipped surrogate (clip 0.8-1.2)", (33,)),
    S("3.6", "asynchronous communication: synchronization overhead -60%", (48,)),
    S("3.7", "ImageNet: 72% of SGD's time, 85% of its memory, 77.1% accuracy", (19,)),
    S("3.8", "an e-commerce recommender: 72 h -> 28 h, accuracy +3.2 points, hardware cost -40%", (49,)),
    S("4.1", "GRPO (Group Relative Policy Optimization), proposed by DeepSeek", (34,)),
    S("4.2", "reward R(x) = sigma(g(x)) - mu(g(x))", (20,)),
    S("4.3", "16K-context code generation vs PPO: convergence +40%, sample efficiency 2.3x, syntax errors -62%", (21,),
      "the row's verdict is per figure: 2.3x refuted, +40% open, -62% never tested"),
    S("4.4", "grouping mitigates vanishing gradients on long sequences", (39,)),
    S("4.5", "the relative comparison lowers the reward's variance", (29,)),
    S("4.6", "DeepSeek's MoE experts are 12-layer decoders (d_model 5120, 80 heads)", (37,)),
    S("4.7", "GRPO as a torch.optim.Optimizer subclass", (30,)),
    S("4.8", "semantic groups: BERT embeddings + K-means", (23,)),
    S("4.9", "group centres recomputed every 1000 (or 500) steps", (23,)),
    S("4.10", "reward model with dropout 0.3: validation-loss fluctuation -58%", (50,)),
    S("4.11", "LayerNorm + GELU fused into one CUDA kernel: 17% FLOPs utilization", (51,)),
    S("4.12", "NCCL all-reduce 120 ms -> 45 ms", (24,)),
    S("4.13", "activation checkpointing every 4 layers: memory -60%, compute +12%", (22,)),
    S("4.14", "AWQ 4-bit quantization loses < 1%", (52,)),
    S("4.15", "development cycle -40%, 92%+ of the original performance kept", (53,)),
)

NOT_COUNTED = (
    ("000", "GPT-3 175B and PaLM 540B parameters (background facts about other models); NVLink/3D-torus/PCIe Gen5 "
            "and tiered-storage advice; monitoring targets (compression > 8:1, overlap > 75%, fragmentation < 15%); "
            "re-evaluating importance every 500 steps; the config's overlap_ratio 0.8; photonic and neuromorphic plans"),
    ("001", "'captures local optimal strategies', 'avoids noise, more stable' (nothing to be true or false about); "
            "grouping and monitoring advice; 'see Hugging Face's transformers extensions'; future directions"),
    ("002", "'applied by several leading vendors' (no vendor named); 'resources scheduled by task priority' (a "
            "recipe, no figure); future directions"),
    ("003", "'SGD falls into local optima', 'reduces memory fragmentation', experience replay and device "
            "fingerprinting (no figure or test named); integration advice; future directions"),
    ("004", "PPO on long sequences is inefficient (background); 'similarity within groups is modelled'; the "
            "hardware list, pip line, 10M+ corpus and training loop (recipes); gradient clipping 1.0, TF-IDF "
            "re-grouping every 500 steps (advice); future directions"),
)


def coverage(n_rows: int) -> dict:
    """{total, with_row, ids_without}: how many seed claims name a row among 1..``n_rows``."""
    without = [s.id for s in SEEDS if not s.rows or any(not 1 <= r <= n_rows for r in s.rows)]
    return {"total": len(SEEDS), "with_row": len(SEEDS) - len(without), "ids_without": without}
