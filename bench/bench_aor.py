"""REFT's AOR on the host (issue 25): what keeping another rank's Adam or AdamW shard costs a
keeper each iteration, against the owner's own step and the copies it replaces, in one run
(docs/performance.md, "REFT's AOR").

    CKPTDB_LIBRARY=build/libckptdb.so PYTHONPATH=python \\
        /usr/bin/python3 bench/bench_aor.py [--mparams 16] [--repeats 7] [--threads 1]

For a ZeRO-1 shard of M million f32 parameters: the owner's torch.optim step (Adam, then AdamW
with weight decay and amsgrad), the keeper's RecomputedOptimizer.step of the same shard from the
same gradients (checked equal bit for bit after every step), and a copy of the state a replica
would otherwise have to receive each iteration (parameters and both moments, 12 bytes a
parameter; a local memcpy, the cheapest such transfer: any network moves it slower). Each is the
median of --repeats. AOR moves 0 bytes between nodes; replicating the shard moves 12 M bytes per
iteration to each replica. Then, in a store, the keeper's put of its replica and the commit
(capture and hashing of the bytes it keeps, as for any shard): the median blocked time of
put_shard + wait_capture against the owner's put of its own state.
"""

import argparse
import os
import shutil
import statistics
import tempfile
import time

import torch

import ckptdb
from ckptdb.torch import RecomputedOptimizer, optimizer_shards


def median_ms(samples):
    return statistics.median(samples) * 1e3


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mparams", type=float, default=16.0)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    n = int(args.mparams * 1e6)
    g = torch.Generator().manual_seed(1)
    state_bytes = 12 * n
    print(f"shard of {n / 1e6:.1f} M f32 parameters ({state_bytes / 2**20:.0f} MiB of parameters "
          f"and moments), torch {torch.__version__}, {args.threads} thread(s), median of "
          f"{args.repeats}")
    print(f"{'optimizer':<28} {'owner_ms':>9} {'keeper_ms':>10} {'keeper/owner':>13} "
          f"{'copy_ms':>8} {'keeper/copy':>12} {'GB/s':>6} {'equal':>6}")
    for kind, hyper in ((torch.optim.Adam, {}),
                        (torch.optim.AdamW, {"weight_decay": 0.01, "amsgrad": True})):
        p = torch.nn.Parameter(torch.randn(n, generator=g))
        owner = kind([p], **hyper)
        keeper = RecomputedOptimizer(kind, [p], **hyper)
        owner_t, keeper_t, copy_t = [], [], []
        equal = True
        dst = [torch.empty(n) for _ in range(3)]
        for step in range(args.repeats + 1):
            grad = torch.randn(n, generator=g)
            p.grad = grad
            t0 = time.perf_counter()
            owner.step()
            t1 = time.perf_counter()
            keeper.step([grad])
            t2 = time.perf_counter()
            st = owner.state[p]
            for d, s in zip(dst, (p.detach(), st["exp_avg"], st["exp_avg_sq"])):
                d.copy_(s)
            t3 = time.perf_counter()
            equal = equal and torch.equal(p.detach().view(torch.int32),
                                          keeper.params[0].view(torch.int32))
            if step > 0:  # the first step allocates the state
                owner_t.append(t1 - t0)
                keeper_t.append(t2 - t1)
                copy_t.append(t3 - t2)
        o, k, c = median_ms(owner_t), median_ms(keeper_t), median_ms(copy_t)
        name = kind.__name__ + (" (wd, amsgrad)" if hyper else "")
        print(f"{name:<28} {o:>9.1f} {k:>10.1f} {k / o:>13.2f} {c:>8.1f} {k / c:>12.2f} "
              f"{state_bytes / (k / 1e3) / 1e9:>6.2f} {'yes' if equal else 'NO':>6}")
    # The keeper's put of its replica beside the owner's put of its own state, in a store of one
    # rank (a replica group needs a job; the capture and hashing are the same).
    root = tempfile.mkdtemp(prefix="ckptdb-bench-aor-", dir="/dev/shm")
    try:
        with ckptdb.Store(os.path.join(root, "root"),
                          tiers=f"ram:{(4 * state_bytes >> 20) + 64}M,keep=2,dir={root}") as store:
            shards = optimizer_shards(owner)
            put_t = []
            for v in range(1, args.repeats + 1):
                t0 = time.perf_counter()
                for name, t in shards.items():
                    store.put_shard(v, name, t)
                store.wait_capture(v)
                put_t.append(time.perf_counter() - t0)
                store.commit(v)
            nbytes = sum(t.numel() * t.element_size() for t in shards.values())
            print(f"put + wait_capture of one shard's state ({nbytes / 2**20:.0f} MiB, the "
                  f"keeper's replica or the owner's own): {median_ms(put_t):.1f} ms, "
                  f"{nbytes / statistics.median(put_t) / 1e9:.2f} GB/s")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
