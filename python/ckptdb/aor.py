"""REFT's AOR, Asynchronous Optimizer Recomputing (docs/python.md, "Recomputed optimizer shards").

With ZeRO-1, each rank of a data-parallel group steps only its own shard of the optimizer state,
so that state has no copy anywhere else; but after the gradients' all-reduce every rank holds the
full gradients. So a rank can keep the next member's optimizer shard itself, on the host, and
bring it forward every iteration with the same update from gradients it already has: no bytes
cross the network. ckptdb stores that replica in the keeper's segment, compares it with the
owner's shard at every commit, and restores the owner from it after the owner's node is lost
(ckptdb_declare_replicas "aor", CKPTDB_PUT_RECOMPUTED).

    # every member: store.declare_replicas(0, range(dp), "aor")
    mine = torch.optim.Adam(my_params, lr=1e-3)               # this rank's ZeRO-1 shard
    theirs = RecomputedOptimizer(torch.optim.Adam, next_rank_params, lr=1e-3)
    ...
    loss.backward(); all_reduce(grads)
    mine.step(); theirs.step(next_rank_grads)
    for name, t in optimizer_shards(mine).items():  store.put_shard(v, name, t)
    for name, t in theirs.shards().items():         store.put_shard(v, name, t, recomputed=True)

Bit equality: RecomputedOptimizer runs torch's own functional Adam or AdamW
(torch.optim._functional) with the optimizer's own defaults and flags, single-tensor (foreach
off: what torch.optim.Adam and AdamW run on CPU tensors), on a copy of the same f32 parameters
with the same gradients and state. Every operation is elementwise (no reduction whose order
could differ), and ATen splits a loop into vector body and scalar tail by its length alone, so
the owner and the keeper compute each element with the same sequence of the same operations:
the results are equal bit for bit on the same torch build and CPU kind. Where they are not (two
builds, two instruction sets), nothing is trusted on faith: the commit compares the digests and
fails the version naming the shard.
"""

from typing import Dict, Optional, Sequence

import torch
import torch.optim._functional as _functional

# The per-parameter state Adam and AdamW keep, in the order the names list it.
_STATE_KEYS = ("step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq")


def _name(prefix: str, index: int, key: str) -> str:
    return f"{prefix}/{index}/{key}"


def optimizer_shards(optimizer: torch.optim.Optimizer, prefix: str = "optim"
                     ) -> Dict[str, torch.Tensor]:
    """The per-parameter state of an Adam or AdamW `optimizer` (a rank's own ZeRO-1 shard) as
    named tensors: prefix/<i>/<key> for the i-th parameter over its param_groups, key one of
    step, exp_avg, exp_avg_sq, max_exp_avg_sq (with amsgrad). A RecomputedOptimizer of the same
    parameters names its shards the same way."""
    _check_kind(type(optimizer))
    out = {}
    index = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            for key in _STATE_KEYS:
                if key in state:
                    out[_name(prefix, index, key)] = state[key]
            index += 1
    return out


def _check_kind(kind) -> None:
    if kind not in (torch.optim.Adam, torch.optim.AdamW):
        raise TypeError(f"REFT's AOR recomputes torch.optim.Adam or AdamW, not {kind.__name__}")


class RecomputedOptimizer:
    """A keeper's replica of another rank's Adam or AdamW shard (REFT's AOR), on the host.

    `optimizer_class` and `kwargs` are exactly what the owner built its optimizer with (one
    parameter group: give each of the owner's groups a RecomputedOptimizer of its own); `params`
    are the owner's parameters as they are before its first step (copied: the replica keeps its
    own); a schedule the owner applies to its group's lr the keeper applies with follow(). `step(grads)` applies the owner's update from the owner's gradients (the slices of the
    all-reduced gradients the owner steps with). Options whose update is not the CPU
    single-tensor one are refused: foreach, fused, capturable and differentiable."""

    def __init__(self, optimizer_class, params: Sequence[torch.Tensor], **kwargs):
        _check_kind(optimizer_class)
        for option in ("foreach", "fused", "capturable", "differentiable"):
            if kwargs.get(option):
                raise ValueError(f"RecomputedOptimizer: {option}=True is not the CPU "
                                 "single-tensor update the replica must repeat bit for bit")
        self.params = [p.detach().to("cpu", copy=True) for p in params]
        for i, p in enumerate(self.params):
            if p.dtype != torch.float32:
                raise TypeError(f"RecomputedOptimizer: parameter {i} is {p.dtype}; "
                                "the replica is kept and updated in float32")
        # The owner's defaults, as torch itself completes and checks them.
        probe = optimizer_class([torch.zeros(1, requires_grad=True)], **kwargs)
        self.kind = optimizer_class
        self.defaults = dict(probe.defaults)
        if self.defaults.get("decoupled_weight_decay"):
            raise ValueError("RecomputedOptimizer: decoupled_weight_decay=True is AdamW's update; "
                             "recompute it with torch.optim.AdamW")
        self.state = []
        for p in self.params:
            state = {"step": torch.tensor(0.0),
                     "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                     "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
            if self.defaults["amsgrad"]:
                state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            self.state.append(state)

    _FOLLOWED = ("lr", "betas", "eps", "weight_decay")

    def follow(self, **hyper) -> None:
        """Takes the owner's hyperparameters as they change (a learning-rate schedule: call it
        with the owner's group's lr before each step, e.g. follow(lr=scheduler.get_last_lr()[0])).
        Only lr, betas, eps and weight_decay change during a run."""
        for key, value in hyper.items():
            if key not in self._FOLLOWED:
                raise ValueError(f"RecomputedOptimizer.follow: {key!r} is not one of "
                                 f"{', '.join(self._FOLLOWED)}")
            self.defaults[key] = value

    @torch.no_grad()
    def step(self, grads: Sequence[Optional[torch.Tensor]]) -> None:
        """One update of the owner's shard from its gradients (None: a parameter without one
        this step, skipped as the owner's optimizer skips it)."""
        if len(grads) != len(self.params):
            raise ValueError(f"RecomputedOptimizer.step: {len(grads)} gradients for "
                             f"{len(self.params)} parameters")
        d = self.defaults
        chosen = [i for i, g in enumerate(grads) if g is not None]
        for i in chosen:
            if grads[i].shape != self.params[i].shape:
                raise ValueError(f"RecomputedOptimizer.step: gradient {i} has shape "
                                 f"{tuple(grads[i].shape)}, parameter {tuple(self.params[i].shape)}")
        if not chosen:
            return
        update = _functional.adamw if self.kind is torch.optim.AdamW else _functional.adam
        amsgrad = d["amsgrad"]
        update([self.params[i] for i in chosen],
               [grads[i].to("cpu", torch.float32) for i in chosen],
               [self.state[i]["exp_avg"] for i in chosen],
               [self.state[i]["exp_avg_sq"] for i in chosen],
               [self.state[i]["max_exp_avg_sq"] for i in chosen] if amsgrad else [],
               [self.state[i]["step"] for i in chosen],
               foreach=False, amsgrad=amsgrad, beta1=d["betas"][0], beta2=d["betas"][1],
               lr=d["lr"], weight_decay=d["weight_decay"], eps=d["eps"],
               maximize=d.get("maximize", False))

    def shards(self, prefix: str = "optim") -> Dict[str, torch.Tensor]:
        """The replica's state by the names optimizer_shards gives the owner's (only parameters
        that have been stepped, as the owner's optimizer keeps state only for those)."""
        out = {}
        for index, state in enumerate(self.state):
            if float(state["step"]) == 0.0:
                continue
            for key in _STATE_KEYS:
                if key in state:
                    out[_name(prefix, index, key)] = state[key]
        return out

    def load_shards(self, shards: Dict[str, torch.Tensor], params: Sequence[torch.Tensor],
                    prefix: str = "optim") -> None:
        """Continues from a restored checkpoint: the owner's state as restored (the names
        optimizer_shards gave it) and the owner's parameters at that step."""
        if len(params) != len(self.params):
            raise ValueError(f"load_shards: {len(params)} parameters for {len(self.params)}")
        self.params = [p.detach().to("cpu", copy=True) for p in params]
        for index, state in enumerate(self.state):
            for key in list(state):
                name = _name(prefix, index, key)
                if name in shards:
                    state[key] = shards[name].detach().to("cpu", copy=True)
                elif key == "step":
                    state[key] = torch.tensor(0.0)
