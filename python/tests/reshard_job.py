"""The resharding test's two sides (python/tests/test_reshard.py).

    RANK=r WORLD_SIZE=4 CKPTDB_COORDINATOR=... CKPTDB_JOB_TOKEN=... reshard_job.py save --dir D
        [--nfs SPEC]
    reshard_job.py load --world W --rank r --split S (ROOT... | --tiers SPEC)

`save`: rank r of a job of 4 saves versions 1..3 of a state whose tensors are split across the
ranks along a different dimension each (unevenly), with a replicated tensor and plain values
beside them, into D/rank<r> (with --nfs, on a ram tier and the shared nfs tier SPEC instead of a local disk).
`load`: rank r of a job of W loads the newest version with its
tensors split along dimension (S + i) mod ndim of tensor i into W near-equal pieces, through
ckptdb.torch.load_sharded from the saved roots (or the tiers SPEC read alone), and checks every element against the global
tensors it computes itself.
"""

import argparse
import os
import sys

import torch

import ckptdb.torch
from ckptdb.torch import Shard

# name -> (global shape, dtype, the dimension the saved job split it along)
TENSORS = {
    "model/w1": ((12, 10), torch.float32, 0),
    "model/w2": ((6, 20), torch.bfloat16, 1),
    "model/conv": ((4, 6, 9), torch.float64, 2),
    "model/emb": ((50, 8), torch.int64, 0),
    "optim/exp_avg/0": ((12, 10), torch.float32, 1),
}


def global_tensor(name: str, step: int) -> torch.Tensor:
    shape, dtype, _ = TENSORS[name]
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    if dtype == torch.int64:
        return torch.randint(-10**12, 10**12, shape, generator=g) + step
    return (torch.randn(shape, generator=g, dtype=torch.float64) + step).to(dtype)


def cuts(length: int, parts: int, uneven: bool):
    """Where `parts` pieces of `length` start and end; uneven: the first piece is one longer,
    the last one shorter (when they can be)."""
    bounds = [length * p // parts for p in range(parts + 1)]
    if uneven and parts > 1 and bounds[1] + 1 < bounds[2]:
        bounds[1] += 1
    return bounds


def piece(name: str, step: int, rank: int, world: int, dim: int, uneven: bool):
    shape = TENSORS[name][0]
    b = cuts(shape[dim], world, uneven)
    offset = [0] * len(shape)
    offset[dim] = b[rank]
    index = tuple(slice(b[rank], b[rank + 1]) if d == dim else slice(None)
                  for d in range(len(shape)))
    return global_tensor(name, step)[index].contiguous(), offset


def state(step: int, rank: int, world: int):
    shards = {}
    for name, (shape, _dtype, dim) in TENSORS.items():
        local, offset = piece(name, step, rank, world, dim, uneven=True)
        shards[name] = Shard(local, shape, offset)
    return {
        "model": {"w1": shards["model/w1"], "w2": shards["model/w2"],
                  "conv": shards["model/conv"], "emb": shards["model/emb"],
                  "bias": torch.arange(10, dtype=torch.float32) * step},  # replicated
        "optim": {"exp_avg": [shards["optim/exp_avg/0"]], "lr": 1e-3 * step},
        "step": step,
    }


def save(args):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    root = os.path.join(args.dir, f"rank{rank}")
    slower = args.nfs or f"disk:{root}/disk"
    ckpt = ckptdb.torch.Checkpointer(root, tiers=f"ram:16M,keep=3,dir={root}/shm;{slower}",
                                     chunk_bytes=4096)
    for step in (1, 2, 3):
        ckpt.save(step, state(step, rank, world))
        ckpt.wait(step)
    ckpt.close()


def load(args):
    into = {"model": {}, "optim": {"exp_avg": [None], "lr": None}, "step": None}
    want = {}
    for i, (name, (shape, dtype, _)) in enumerate(TENSORS.items()):
        dim = (args.split + i) % len(shape)
        expected, offset = piece(name, 3, args.rank, args.world, dim, uneven=False)
        want[name] = expected
        target = Shard(torch.full_like(expected, 7), shape, offset)
        if name.startswith("model/"):
            into["model"][name[len("model/"):]] = target
        else:
            into["optim"]["exp_avg"][0] = target
    into["model"]["bias"] = torch.zeros(10)
    got = ckptdb.torch.load_sharded(args.roots, into, tiers=args.tiers)
    checked = 0
    for name, expected in want.items():
        node = got["model"][name[6:]] if name.startswith("model/") else got["optim"]["exp_avg"][0]
        if not torch.equal(node.tensor, expected):
            print(f"rank {args.rank} of {args.world}: {name} differs", file=sys.stderr)
            return 1
        checked += expected.numel()
    if not torch.equal(got["model"]["bias"], torch.arange(10, dtype=torch.float32) * 3):
        print(f"rank {args.rank}: bias differs", file=sys.stderr)
        return 1
    if got["step"] != 3 or got["optim"]["lr"] != 1e-3 * 3:
        print(f"rank {args.rank}: plain values {got['step']}, {got['optim']['lr']}", file=sys.stderr)
        return 1
    print(f"rank {args.rank} of {args.world}: {checked} elements equal")
    return 0


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("save")
    s.add_argument("--dir", required=True)
    s.add_argument("--nfs")
    ld = sub.add_parser("load")
    ld.add_argument("--world", type=int, required=True)
    ld.add_argument("--rank", type=int, required=True)
    ld.add_argument("--split", type=int, required=True)
    ld.add_argument("--tiers")
    ld.add_argument("roots", nargs="*")
    args = parser.parse_args()
    torch.set_num_threads(1)
    return save(args) if args.mode == "save" else load(args)


if __name__ == "__main__":
    sys.exit(main())
