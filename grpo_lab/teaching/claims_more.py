"""Claims 38-53: the rows added once the five write-ups were read claim by claim
(claims_seeds.SEEDS numbers them): three settleable claims that had no row, computed in
claims_formulas.py (38-40), then one row per bare figure, a percentage or speed-up with no model,
data, hardware or source to re-run, grouped where one measurement would settle several (41-53).
Data only, like claims_data.py, whose ``CLAIMS`` ends with these."""
from __future__ import annotations

from grpo_lab.teaching.claims_record import Claim

_BARE = "A number without a setup cannot be checked, only repeated."


def _bare(number: int, claim: str, fair_test: str, why: str, missing: str, **kw) -> Claim:
    """A bare figure: nothing named to re-run, so nothing measured, and the verdict says so."""
    return Claim(number, claim, "no", fair_test, "cannot be tested here", "", why, kw.pop("remember", _BARE),
                 measured=kw.pop("measured", f"not measured: {missing}"), source=kw.pop("source", ""), **kw)


MORE = [
    Claim(38, 'a gradient\'s importance scored as "0.7 var(history) + 0.3 ||grad||" (write-up 000), a node\'s '
              'efficiency as "HPM = alpha FLOPS + beta bandwidth - gamma latency" (003): scores that add quantities '
              'of different units', "fact",
          "the write-ups' own formulas on two gradients whose loss is scaled, and on two nodes in two sets of units; "
          "each node's time on two jobs",
          "does not hold", "",
          "A variance is in squared gradient units, a norm in gradient units that grows with the tensor's size: "
          "multiplying the loss by a constant (the fp16 loss scale of 1024, a learning-rate change folded into the "
          "loss) reorders the same two gradients, so the score measures the units chosen, not importance. HPM with "
          "equal weights ranks node B first in FLOP/s and B/s and node A first in TFLOPS and GB/s; fitted weights "
          "absorb the units but not the form: a node's time on a job is work / FLOP/s + bytes / bandwidth + "
          "latency, so the compute-bound job runs faster on B and the bandwidth-bound one on A, and no one score "
          "per node ranks both.",
          "Add only quantities of one unit; rank hardware by the time of the job, not by a weighted sum of its specs.",
          measured="0.7 var + 0.3 norm, a small fluctuating and a large steady gradient: loss x 1: small 3.70, large "
                   "6.01; loss x 1024: small 737,075.20, large 13,484.03; HPM (weights 1) for node A (100 TFLOPS, "
                   "3,000 GB/s) and B (200 TFLOPS, 1,500 GB/s): in SI: node B first; in TFLOPS, GB/s, us: node A "
                   "first; compute-bound job: node B faster (10.34 vs 5.68 ms, A vs B); bandwidth-bound job: node A "
                   "faster (10.11 vs 20.06 ms, A vs B)",
          source="computed: claims_formulas.mixed_unit_scores()", live="mixed_unit_scores"),
    Claim(39, 'grouping "mitigates vanishing gradients in long-sequence training" (write-up 004)', "toy",
          "the gradient GRPO's loss gives each token of completions of several lengths, under GRPO's token mean and "
          "Dr. GRPO's constant (Liu et al. 2025)",
          "does not hold", "",
          "The group sets one number per completion, its advantage, and every token of that completion gets it: "
          "grouping changes nothing of how a gradient flows back through a long sequence, which is the network's. "
          "What does depend on length is GRPO's own aggregation: the mean over a completion's tokens divides each "
          "token's weight by its length, so a 64-token completion's tokens get a quarter of a 16-token one's (the "
          "length bias Dr. GRPO, Liu et al. 2025, removes with a constant). Long completions get weaker per-token "
          "gradients under GRPO, not stronger ones.",
          "An advantage is one number per completion; length enters through the loss's aggregation, not the group.",
          measured="d loss / d log pi per token, A = 1, one completion each of 4, 16, 64 tokens: GRPO's 1/|o| mean 4 "
                   "tokens 0.0833, 16 tokens 0.0208, 64 tokens 0.0052 (summed: 0.3333 each); Dr. GRPO's constant 4 "
                   "tokens 0.0052, 16 tokens 0.0052, 64 tokens 0.0052",
          source="computed: claims_formulas.length_weight() (grpo_loss)", live="length_weight"),
    Claim(40, 'grouping "high-quality with low-quality samples" in one group "may mislead the policy" (write-up 001)',
          "toy",
          "GRPO's advantages of the same completions grouped by prompt and with two prompts in one group; a group "
          "whose rewards are all equal",
          "holds only as", "mixing prompts of different difficulty in one group, where the advantage then rewards "
                           "the easy prompt over the better completion; mixing good and bad completions of one prompt "
                           "is GRPO's signal, and a group of equal rewards teaches nothing",
          "Within one prompt's group, the spread between better and worse completions is what the advantage is made "
          "of: a group of equal rewards has advantage 0 everywhere. The claim holds for groups made of several "
          "prompts (the write-up groups by topic): the hard prompt's better completion falls below the mixed "
          "group's mean and is pushed down, the easy prompt's worse one is pushed up. Claim 23's semantic groups "
          "give non-zero advantages partly this way.",
          "Group the completions of one prompt: their spread is the signal, a mix of prompts adds their difficulty to it.",
          measured="rewards 0.9, 0.7 (easy prompt) and 0.3, 0.1 (hard prompt): GRPO advantages by prompt +0.71, "
                   "-0.71, +0.71, -0.71; in one group +1.10, +0.55, -0.55, -1.10: 2 of 4 signs flip; one prompt's "
                   "group of equal rewards: +0.00, +0.00, +0.00, +0.00",
          source="computed: claims_formulas.mixed_group() (advantages.ADVANTAGES['grpo'])", live="mixed_group"),
    # ------------------------------------------------------------------------------ bare figures
    _bare(41, 'training a 175B model on A100s: All-Reduce takes "35%" of the training time; data-parallel '
              'utilization per card is "only 62%" (write-up 000)',
          "one profiled step of the named model and cluster: communication share and model FLOPs utilization",
          "Both shares depend on the GPU count, batch, sequence length, parallel layout and network, none of which "
          "is named; one profiled step of that setup would settle both, and none is here.",
          "no GPU count, batch, network or parallel layout is named"),
    _bare(42, 'deploying "GRPO" cuts the cluster needed for a trillion-parameter model by "40%" and saves "over ten '
              'million dollars" a year (write-up 000)',
          "the cluster sizes and costs of the named training, with and without the method",
          "No model, training run, cluster or price is named; the figure follows from none of the write-up's "
          "other figures.", "no training run, cluster or cost is named"),
    _bare(43, 'spreading groups over devices raises "resource utilization by over 30%" (write-up 001)',
          "utilization of the named cluster with and without the grouping",
          "Neither the cluster, the model nor the baseline is named. Groups of one prompt's completions are "
          "independent until the loss, so spreading them over devices is ordinary data parallelism, whose "
          "utilization depends on the setup.", "no cluster, model or baseline is named"),
    _bare(44, 'grouping by task in multi-task training cuts negative transfer and raises "resource utilization by '
              '25%" (write-up 001)',
          "the named tasks trained jointly with and without task groups: per-task accuracy and utilization",
          "No tasks, model or measure of utilization is named.", "no tasks, model or measure is named"),
    _bare(45, 'dynamic parallel orchestration (data, pipeline, tensor parallelism re-planned live): "utilization '
              '+20%", "communication -15%" (write-up 002)',
          "the named cluster and model under a fixed and the re-planned layout: utilization and bytes sent",
          "No model, cluster or fixed layout to compare with is named; one run of both would settle both figures.",
          "no model, cluster or baseline layout is named"),
    _bare(46, 'removing duplicate operators from the computation graph saves "15%-20% of the FLOPs" (write-up 002)',
          "the named graph's FLOPs before and after common-subexpression elimination",
          "No graph or model is named; what eliminating repeated operators saves is a property of the graph, to be "
          "counted on it.", "no graph or model is named"),
    _bare(47, 'one training run costs "40% less or more" with "GRPO" (write-up 002)',
          "the named run's cost with and without the method",
          "No run, model, hardware or price is named; the write-up's own table (claim 17) cites a paper that cannot "
          "be found.", "no run, hardware or price is named"),
    _bare(48, 'an asynchronous communication protocol cuts "the synchronization overhead by 60%" (write-up 003)',
          "the named cluster's step time with synchronous and asynchronous gradient exchange",
          "No cluster, model or protocol is named, so the 60% cannot be re-run. The mechanism can be seen on 2 gloo "
          "CPU processes (claim 7): asynchronous bucketed reduction saved a median -13%, +5% and +35% of the "
          "communication time at batches 2, 8 and 32, so how much overlap hides depends on how long backward runs.",
          "no cluster, model or protocol is named",
          measured="not measured at any named scale; the mechanism on 2 gloo CPU processes (claim 7): median time "
                   "saved -13%, +5%, +35% of the communication at batches 2, 8, 32 (all_reduce)",
          source="BENCHMARKS.md section 7 (bench/bench_topology.py --only overlap), for the mechanism only",
          quotes=(("BENCHMARKS.md", "| 32 | all_reduce | 24-41 ms | 7.1-17.2 ms | 4 of 4 | 55 .. 95% (84%) "
                                    "| +5% .. +120% (+35%) |"),
                  ("BENCHMARKS.md", "| 8 | all_reduce | 3.3-13 ms | 6.0-18.3 ms | 4 of 4 | 41 .. 98% (75%) | -27% .. +30% (+5%) |"),
                  ("BENCHMARKS.md", "| 2 | all_reduce | 1.5-1.7 ms | 3.4-8.8 ms | 4 of 4 | 32 .. 72% (63%) | -18% .. +2% (-13%) |")),
          remember="Name the cluster before the saving; overlap hides only what backward is long enough to cover."),
    _bare(49, 'in "an e-commerce recommender", training "72 h -> 28 h", accuracy "+3.2 points", hardware cost '
              '"-40%" (write-up 003)',
          "the named system trained with SGD/Adam and with the method",
          "No company, model, data or hardware is named, and a recommender is not an RL-from-completions setting "
          "(claim 19 is the same write-up's ImageNet table).", "no system, data or hardware is named"),
    _bare(50, 'the reward model with dropout 0.3: "validation-loss fluctuation -58%" (write-up 004)',
          "the named reward model's validation loss over training with and without dropout, over seeds",
          "No reward model, data or measure of fluctuation is named.", "no reward model, data or measure is named"),
    _bare(51, 'fusing LayerNorm + GELU into one CUDA kernel: "17%" FLOPs utilization (write-up 004)',
          "the named model's step on the named GPU with and without the fused kernel",
          "No model, GPU or baseline utilization is named, and whether 17% is a gain or the level reached is not "
          "said; no GPU is here.", "no model or GPU is named; no GPU here"),
    _bare(52, 'AWQ 4-bit quantization loses "< 1%" accuracy (write-up 004)',
          "the named model quantized with AWQ: the named metric before and after",
          "No model, task, metric or group size is named; a loss in accuracy under quantization is the model's and "
          "the task's.", "no model, task or metric is named"),
    _bare(53, 'the write-up\'s method cuts "the development cycle by 40%" while keeping "92%+ of the original '
              'performance" (write-up 004)',
          "the named project's schedule and metric with and without the method",
          "No project, model, metric or baseline is named.", "no project, model or metric is named"),
]
