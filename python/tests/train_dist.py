"""One rank of a 4-process data-parallel training run for the real-client test
(python/tests/test_torch.py): train.py's model, each rank on its own batches, gradients
averaged over gloo with one all-reduce per parameter in a fixed order (with
DistributedDataParallel a resumed run ended different from an uninterrupted one: most likely
its bucket rebuild after the first iteration changes the summation order), checkpointing every
step through ckptdb.torch into its own store (a job of 4 ranks on 4 simulated nodes,
replicate:2; the coordinator and token from the environment).

    RANK=r WORLD_SIZE=4 MASTER_ADDR=... MASTER_PORT=... CKPTDB_COORDINATOR=... \\
    CKPTDB_JOB_TOKEN=... train_dist.py --steps N --out FILE [--dir DIR [--kill-at K]]

Without --dir it trains straight through. With --dir it resumes from the job's latest
checkpoint, and the rank given --kill-at SIGKILLs itself right after handing step K's
checkpoint over (the others then hang in the next all-reduce until the test kills them, as a
scheduler would). At the end each rank writes its final parameters and optimizer state to
FILE (torch.save) and the step it resumed from to FILE.resumed.
"""

import argparse
import os

import torch
import torch.distributed as dist
from train import Net, checkpoint, finish, resume


def batch(step: int, rank: int):
    g = torch.Generator().manual_seed(100000 * (rank + 1) + step)
    return torch.randn(8, 4, 16, generator=g), torch.randn(8, generator=g)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--dir")
    parser.add_argument("--kill-at", type=int, default=0)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(1234)
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    start = 1
    ckpt = None
    if args.dir:
        import ckptdb.torch  # noqa: PLC0415

        node = os.path.join(args.dir, f"node{rank}")
        os.environ["CKPTDB_NODE_ID"] = f"node{rank}"
        ckpt = ckptdb.torch.Checkpointer(
            os.path.join(node, "root"),
            tiers=f"ram:32M,keep=2,dir={node}/shm;disk:{node}/disk,every=5,keep=2",
            redundancy="replicate:2")
        start = resume(ckpt, model, optimizer)
        ckpt.hook(optimizer)
    world = dist.get_world_size()
    with open(args.out + ".resumed", "w") as f:
        f.write(str(start - 1))

    for step in range(start, args.steps + 1):
        x, y = batch(step, rank)
        loss = ((model(x) - y) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        for parameter in model.parameters():
            dist.all_reduce(parameter.grad)
            parameter.grad /= world
        optimizer.step()
        if ckpt is not None:
            checkpoint(ckpt, step, model, optimizer, args.kill_at)
    if ckpt is not None:
        ckpt.wait(args.steps)
        # Rank 0 hosts the coordinator: it closes after the others.
        dist.barrier()
        if rank != 0:
            ckpt.close()
        dist.barrier()
        if rank == 0:
            ckpt.close()
    finish(args.out, model, optimizer)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
