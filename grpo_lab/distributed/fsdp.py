"""Parameters, gradients and optimizer state sharded by torch's FSDP2 (``fully_shard``).

Every other exchange keeps the whole fp32 policy on every rank. FSDP2 (Zhao et al. 2023,
"PyTorch FSDP"; torch's ``torch.distributed.fsdp.fully_shard``) keeps 1/N of each tensor
per rank, as a ``DTensor`` sharded on dim 0, and gathers a block's weights only while it runs:

    per rank, P parameters, N ranks, fp32 + AdamW      whole (allreduce)     FSDP2
        weights                                          4 P                 4 P / N
        gradients                                        4 P                 4 P / N
        AdamW moments (exp_avg, exp_avg_sq)              8 P                 8 P / N
        the largest gathered block while it runs          -                  4 P_block
    bytes sent per step (ring algorithms, b = 4 P)
        all_reduce of the gradients                    2 (N-1)/N b            -
        all_gather of the weights, forward (+ backward     -              (N-1)/N b (x2)
          again when reshard_after_forward)
        reduce_scatter of the gradients                    -              (N-1)/N b

FSDP2's reduce-scatter *averages* the gradients (it divides by N), as the allreduce exchange
does, so the same loss (step.py scales each rank's loss by N x its share of the global batch)
gives the same update: 1 vs N processes agree up to float rounding.

One deviation from using FSDP2 in a supervised loop: a GRPO step also *samples*, and each
rank decodes for as many steps as its own completions need. FSDP2 all-gathers a block's
weights in the block's forward, so ranks that run different numbers of forwards would wait on
each other forever. ``gathered(model)`` therefore all-gathers every FSDP module's weights once,
on every rank together, and keeps them gathered (no collective in any forward) until it ends:
the trainer wraps the rollout, the reference's forwards and evaluation in it. Inside it the
weights are whole on every rank (4 P bytes, as for the other exchanges); the training forward
and backward run outside it, sharded.
"""
from __future__ import annotations

import contextlib
import warnings

import torch
from torch.autograd.graph import increment_version

DTYPES = {"": None, "float32": torch.float32, "bfloat16": torch.bfloat16,
          "float16": torch.float16}


def _dtensor():
    from torch.distributed.tensor import DTensor
    return DTensor


def blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks FSDP2 shards one by one: the toy GPT's ``blocks``, a
    transformers model's decoder layers (``model.model.layers``; under peft one level
    deeper)."""
    if hasattr(model, "blocks"):                                           # model.GPT
        return list(model.blocks)
    inner = getattr(model, "model", None)                                  # hf.HFPolicy
    if hasattr(inner, "get_base_model"):                                   # peft
        inner = inner.get_base_model()
    layers = getattr(getattr(inner, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"exchange 'fsdp2' shards a policy's transformer blocks; found none in "
                         f"a {type(model).__name__} (expected .blocks or .model.model.layers)")
    return list(layers)


def shard(model: torch.nn.Module, reshard_after_forward: bool = True,
          param_dtype: str = "") -> list[torch.nn.Module]:
    """``fully_shard`` each block, then the root (embeddings, final norm, head: tied weights
    stay one parameter in the root's group) -> the FSDP modules, blocks first, root last.
    ``param_dtype``: the dtype weights are gathered and run in (MixedPrecisionPolicy; "": as
    stored), gradients reduced in float32. The root keeps its weights gathered from forward
    to backward (they are the first backward needs)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    # FSDP2 warns when a block returns a view (the toy's k, v after transpose): an in-place op
    # on it would skip the pre-backward hook. Nothing here writes a block's output in place
    # (the KV caches are extended with torch.cat), so the warning is noise on every forward.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    mp = MixedPrecisionPolicy(param_dtype=DTYPES[param_dtype], reduce_dtype=torch.float32)
    mods = blocks(model)
    for b in mods:
        fully_shard(b, reshard_after_forward=reshard_after_forward, mp_policy=mp)
    fully_shard(model, reshard_after_forward=False, mp_policy=mp)
    return mods + [model]


@contextlib.contextmanager
def gathered(mods: list[torch.nn.Module], reshard_after_forward: bool):
    """Every FSDP module's weights all-gathered once (a collective: every rank enters this
    together, root first), no collective in any forward inside (nothing is resharded after a
    forward), resharded at the end. The version counters of the gathered weights that train
    are bumped, so what caches derived copies of them (hf.py's lean decoder stacks q/k/v;
    the copy-out of FSDP2's all-gather preserves the counters) sees they changed."""
    root = mods[-1]
    for m in [root, *mods[:-1]]:
        m.unshard()
    for m in mods:
        m.set_reshard_after_forward(False, recurse=False)
    increment_version([p for p in root.parameters() if p.requires_grad])
    try:
        yield
    finally:
        for m in mods[:-1]:
            m.set_reshard_after_forward(reshard_after_forward, recurse=False)
        for m in mods:
            m.reshard()


class CountedAllGather:
    """FSDP2's all-gather (``dist.all_gather_single``, its default), counting the bytes of
    every gathered output: installed with ``FSDPModule.set_custom_all_gather`` on each FSDP
    module, so what is counted is what FSDP2 actually gathered (forward, backward, the
    gathered rollout; FSDP2's dim-0 padding included). One rank sends (N-1)/N of each output
    under the ring algorithm."""

    def __init__(self):
        self.bytes = 0

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, async_op: bool = False):
        import torch.distributed as dist
        self.bytes += output_tensor.numel() * output_tensor.element_size()
        return dist.all_gather_single(output_tensor, input_tensor, group=group,
                                      async_op=async_op)


def count_all_gathers(mods: list[torch.nn.Module]) -> CountedAllGather:
    """One ``CountedAllGather`` for every FSDP module of ``shard``."""
    counter = CountedAllGather()
    for m in mods:
        m.set_custom_all_gather(counter)
    return counter


def full(t):
    """A DTensor's whole value (an all-gather: every rank calls it), a tensor as it is."""
    return t.full_tensor() if isinstance(t, _dtensor()) else t


def local(t):
    """This rank's shard of a DTensor, a tensor as it is."""
    return t.to_local() if isinstance(t, _dtensor()) else t


def full_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model.state_dict()`` with every sharded tensor gathered whole (on every rank: a
    collective), on the CPU, each tied parameter once, under its first name (as
    checkpoint.state_without_aliases keeps it)."""
    first = {}
    for k, v in model.state_dict(keep_vars=True).items():      # the parameters themselves:
        first.setdefault(id(v), (k, v))                           # a tied one is one object
    return {k: full(v).detach().cpu() for k, v in first.values()}


def full_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """(name -> whole value) of every parameter, detached copies (a collective when sharded)."""
    return {n: full(p.detach()).clone() for n, p in model.named_parameters()}


def full_optimizer_state(adam: torch.optim.Optimizer) -> dict:
    """torch.optim's state_dict with each sharded moment gathered whole (a collective), on the
    CPU: the format every other exchange saves, so a run resumes on any number of ranks."""
    sd = adam.state_dict()
    state = {pid: {k: full(v).detach().cpu() if torch.is_tensor(v) else v
                   for k, v in st.items()}
             for pid, st in sorted(sd["state"].items())}
    return {"state": state, "param_groups": sd["param_groups"]}


def load_full_optimizer_state(adam: torch.optim.Optimizer, sd: dict) -> None:
    """Load a whole-tensor optimizer state (``full_optimizer_state``'s format) into an AdamW
    over sharded parameters: each moment cut to this rank's shard of its parameter (no
    collective: every rank holds the whole state)."""
    from torch.distributed.tensor import distribute_tensor
    params = [p for g in adam.param_groups for p in g["params"]]
    state = {}
    for pid, st in sd["state"].items():
        p = params[int(pid)]
        state[pid] = {k: (distribute_tensor(v.to(p.device, p.dtype), p.device_mesh, p.placements,
                                            src_data_rank=None)
                          if isinstance(p, _dtensor()) and torch.is_tensor(v)
                          and v.shape == p.shape else v)
                      for k, v in st.items()}
    adam.load_state_dict({"state": state, "param_groups": sd["param_groups"]})
