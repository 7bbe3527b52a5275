"""One rank of the AOR test's job (python/tests/test_aor.py): a ZeRO-1 data-parallel group of
3 ranks on 3 simulated nodes, in a job without redundancy, declared as one replica group with
REFT's AOR ("aor").

    RANK=r WORLD_SIZE=3 CKPTDB_COORDINATOR=... CKPTDB_JOB_TOKEN=... \\
        aor_job.py train --dir D --steps N --out FILE
    ... aor_job.py restore --dir D --step N --out FILE [--expect-lost]

`train`: every rank holds the same f32 parameters (a replicated shard) and steps its own third of
them with torch.optim.Adam (or AdamW: --adamw) on the CPU, from gradients that are the same on
every rank (what an all-reduce leaves); it also keeps the next rank's third with a
RecomputedOptimizer, and each step puts the parameters (replicated), its own optimizer state
(private) and the next rank's (recomputed), and commits. At the end it writes its own optimizer
state and the parameters to FILE (torch.save). `restore`: the job restarted (a node may be gone):
each rank restores the parameters and its own optimizer state of step N and writes them to FILE;
with --expect-lost, rank 1 expects its state to be unrecoverable and writes the error instead.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist

import ckptdb
import ckptdb.torch
from ckptdb.torch import RecomputedOptimizer, optimizer_shards

RANKS = 3
SIZES = (1000, 37, 513)  # the model's parameters, flattened into one buffer as ZeRO-1 does
HYPER = {"lr": 3e-3, "betas": (0.8, 0.95), "weight_decay": 0.01, "amsgrad": True}


def bounds(total: int):
    """Where each rank's third of the flat buffer starts and ends (uneven: ZeRO-1 pads, we don't)."""
    return [total * r // RANKS for r in range(RANKS + 1)]


def initial() -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    return torch.randn(sum(SIZES), generator=g)


def gradient(flat: torch.Tensor, step: int) -> torch.Tensor:
    """The all-reduced gradient of step `step`: a function of the parameters, the same on every
    rank."""
    g = torch.Generator().manual_seed(1000 + step)
    return torch.sin(flat * step) + 0.1 * torch.randn(flat.shape, generator=g)


def open_store(directory: str, rank: int) -> ckptdb.Store:
    node = os.path.join(directory, f"node{rank}")
    os.makedirs(os.path.join(node, "shm"), exist_ok=True)
    store = ckptdb.Store(os.path.join(node, "root"),
                         tiers=f"ram:64M,keep=2,dir={os.path.join(node, 'shm')}", rank=rank,
                         world_size=RANKS, node_id=f"node{rank}", redundancy="replicate:1",
                         chunk_bytes=4096)
    store.declare_replicas(0, range(RANKS), "aor")
    return store


def close_together(store: ckptdb.Store, rank: int) -> None:
    """A job's ranks close together, rank 0 (the coordinator) last (docs/api.md)."""
    dist.barrier()
    if rank != 0:
        store.close()
    dist.barrier()
    if rank == 0:
        store.close()


def train(args, rank: int) -> None:
    kind = torch.optim.AdamW if args.adamw else torch.optim.Adam
    flat = initial()
    b = bounds(flat.numel())
    widest = max(b[r + 1] - b[r] for r in range(RANKS))
    nxt = (rank + 1) % RANKS
    # This rank's shard of the parameters, as ZeRO-1 keeps it: a view into its own flat buffer
    # at an offset (so not 64-byte aligned), stepped by its own optimizer.
    own_buffer = torch.zeros(b[rank + 1] - b[rank] + 3)
    own = torch.nn.Parameter(own_buffer[3:])
    with torch.no_grad():
        own.copy_(flat[b[rank]:b[rank + 1]])
    mine = kind([own], **HYPER)
    theirs = RecomputedOptimizer(kind, [flat[b[nxt]:b[nxt + 1]]], **HYPER)
    differing = []  # steps whose recomputed parameters differ from the owner's, bit for bit
    store = open_store(args.dir, rank)
    for step in range(1, args.steps + 1):
        grad = gradient(flat, step)
        own.grad = grad[b[rank]:b[rank + 1]].clone()
        mine.step()
        theirs.step([grad[b[nxt]:b[nxt + 1]]])
        # ZeRO-1's all-gather of the owners' updated thirds.
        send = torch.zeros(widest)
        send[:own.numel()] = own.detach()
        gathered = [torch.zeros(widest) for _ in range(RANKS)]
        dist.all_gather(gathered, send)
        flat = torch.cat([gathered[r][:b[r + 1] - b[r]] for r in range(RANKS)])
        if not torch.equal(flat[b[nxt]:b[nxt + 1]].view(torch.int32),
                           theirs.params[0].view(torch.int32)):
            differing.append(step)
        store.put_shard(step, "params", flat, replicated=True, copy_now=True)
        for name, t in optimizer_shards(mine).items():
            store.put_shard(step, name, t, copy_now=True)
        for name, t in theirs.shards().items():
            store.put_shard(step, name, t, copy_now=True, recomputed=True)
        store.commit(step)
    torch.save({"state": {k: v.clone() for k, v in optimizer_shards(mine).items()},
                "differing": differing}, args.out)
    close_together(store, rank)


def restore(args, rank: int) -> None:
    total = sum(SIZES)
    b = bounds(total)
    n = b[rank + 1] - b[rank]
    shapes = {"step": (), "exp_avg": (n,), "exp_avg_sq": (n,), "max_exp_avg_sq": (n,)}
    out = {}
    store = open_store(args.dir, rank)
    out["latest"] = store.latest()
    try:
        for key, shape in shapes.items():
            t = torch.empty(shape)
            store.restore(args.step, f"optim/0/{key}", t)
            out[key] = t
        out["error"] = None
    except ckptdb.Error as e:
        if not args.expect_lost:
            raise
        out["error"] = str(e)
    torch.save(out, args.out)
    close_together(store, rank)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("phase", choices=("train", "restore"))
    parser.add_argument("--dir", required=True)
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--step", type=int, default=0)
    parser.add_argument("--out", required=True)
    parser.add_argument("--adamw", action="store_true")
    parser.add_argument("--expect-lost", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    (train if args.phase == "train" else restore)(args, rank)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
