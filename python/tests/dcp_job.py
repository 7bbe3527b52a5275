"""The DCP test's two sides (python/tests/test_dcp.py): PyTorch's distributed checkpoint (Debian's
torch 1.13, `torch.distributed._shard.checkpoint`) saving through ckptdb.torch.dcp.StorageWriter
and loading, resharded, through StorageReader.

    RANK=r WORLD_SIZE=2 MASTER_PORT=p CKPTDB_COORDINATOR=... dcp_job.py save --dir D
    RANK=r WORLD_SIZE=W MASTER_PORT=p dcp_job.py load --world W --rank r --version V ROOT...

`save`: rank r of a job of 2 (a gloo process group, and a ckptdb job of 2 ranks whose stores are
D/rank<r>) holds ShardedTensors split along dimension 0 over the 2 ranks, a tensor every rank
has the same of, a 0-dim tensor and plain values. Version 1 is saved with the writer's default
(capture waited for inside the save) and every tensor is overwritten right after the save
returns; version 2 with wait_capture=False, the tensors overwritten right after
writer.wait_capture(). Both are then waited for until committed.
`load`: rank r of a job of W loads version V from the saved roots, opened read-only, into
ShardedTensors split along dimension 1 over W ranks (W = 1: plain tensors), and checks every
element against the values it computes itself.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist

import ckptdb
import ckptdb.torch
from ckptdb.torch.dcp import StorageReader, StorageWriter, dcp  # DCP imported (import_dcp)
from torch.distributed._shard import sharded_tensor  # noqa: E402 - after DCP's import
from torch.distributed._shard.sharding_spec import ChunkShardingSpec  # noqa: E402

SHARDED = {"model.w": ((12, 10), torch.float32), "model.emb": ((9, 8), torch.int64)}


def global_value(name: str, version: int) -> torch.Tensor:
    if name in SHARDED:
        shape, dtype = SHARDED[name]
    else:
        shape, dtype = {"model.bias": ((10,), torch.bfloat16), "scale": ((), torch.float64)}[name]
    g = torch.Generator().manual_seed(sum(map(ord, name)) + 1000 * version)
    if dtype == torch.int64:
        return torch.randint(-10**12, 10**12, shape, generator=g)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


def plain_values(version: int) -> dict:
    return {"step": 100 + version, "schedule": {"lr": [0.1, 0.01], "name": "cosine"}}


def sharded(name: str, dim: int, world: int, version: int) -> sharded_tensor.ShardedTensor:
    shape, dtype = SHARDED[name]
    spec = ChunkShardingSpec(dim=dim, placements=[f"rank:{r}/cpu" for r in range(world)])
    st = sharded_tensor.empty(spec, *shape, dtype=dtype)
    whole = global_value(name, version) if version else torch.zeros(shape, dtype=dtype)
    for shard in st.local_shards():
        index = tuple(slice(o, o + n) for o, n in zip(shard.metadata.shard_offsets,
                                                     shard.metadata.shard_sizes))
        shard.tensor.copy_(whole[index])
    return st


def local_tensors(state: dict):
    for value in state.values():
        if isinstance(value, sharded_tensor.ShardedTensor):
            yield from (s.tensor for s in value.local_shards())
        elif isinstance(value, torch.Tensor):
            yield value


def save(args) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    store = ckptdb.Store(os.path.join(args.dir, f"rank{rank}"),
                         tiers="ram:64M,keep=2,dir=" + os.path.join(args.dir, f"shm{rank}"),
                         rank=rank, world_size=world, node_id=f"node{rank}",
                         redundancy="none")
    for version, wait in ((1, True), (2, False)):
        state = {name: sharded(name, 0, world, version) for name in SHARDED}
        state["model.bias"] = global_value("model.bias", version)
        state["scale"] = global_value("scale", version)
        state.update(plain_values(version))
        writer = StorageWriter(store, version=version, wait_capture=wait)
        dcp.save_state_dict(state, writer)
        if not wait:
            writer.wait_capture()
        for t in local_tensors(state):  # the next optimizer step, at once
            t.fill_(-1)
        writer.wait_commit()
        print(f"rank {rank}: saved v{version} (wait_capture={wait})")
    dist.barrier()
    store.close()
    dist.destroy_process_group()


def load(args) -> int:
    rank, world = args.rank, args.world
    if world > 1:
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    stores = [ckptdb.Store(root, read_only=True) for root in args.roots]
    if world > 1:
        state = {name: sharded(name, 1, world, 0) for name in SHARDED}
    else:
        state = {name: torch.zeros(SHARDED[name][0], dtype=SHARDED[name][1]) for name in SHARDED}
    state["model.bias"] = torch.zeros(10, dtype=torch.bfloat16)
    state["scale"] = torch.zeros((), dtype=torch.float64)
    state["step"] = 0
    state["schedule"] = {}
    dcp.load_state_dict(state, StorageReader(stores, version=args.version), no_dist=world == 1)
    bad = 0
    for name in SHARDED:
        want = global_value(name, args.version)
        value = state[name]
        parts = ([(tuple(s.metadata.shard_offsets), s.tensor) for s in value.local_shards()]
                 if world > 1 else [((0,) * want.dim(), value)])
        for offsets, got in parts:
            index = tuple(slice(o, o + n) for o, n in zip(offsets, got.shape))
            if not torch.equal(got, want[index]):
                print(f"rank {rank}: {name} at {offsets} differs", file=sys.stderr)
                bad += 1
    for name in ("model.bias", "scale"):
        if not torch.equal(state[name], global_value(name, args.version)):
            print(f"rank {rank}: {name} differs", file=sys.stderr)
            bad += 1
    for name, want in plain_values(args.version).items():
        if state[name] != want:
            print(f"rank {rank}: {name} is {state[name]!r}, not {want!r}", file=sys.stderr)
            bad += 1
    for s in stores:
        s.close()
    if world > 1:
        dist.destroy_process_group()
    if bad == 0:
        print(f"rank {rank} of {world}: v{args.version} loaded bit for bit")
    return 1 if bad else 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("side", choices=["save", "load"])
    parser.add_argument("--dir")
    parser.add_argument("--world", type=int, default=1)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--version", type=int, default=1)
    parser.add_argument("roots", nargs="*")
    args = parser.parse_intermixed_args()
    if args.side == "save":
        save(args)
        return 0
    return load(args)


if __name__ == "__main__":
    sys.exit(main())
