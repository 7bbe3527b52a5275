"""Many small tensors (issue 23): the blocked time of a ckptdb.torch save of N tensors of 1 KiB
against torch.save of the same dict into tmpfs, in one run (docs/performance.md, "Many small
tensors").

    CKPTDB_LIBRARY=build/libckptdb.so PYTHONPATH=python \\
        /usr/bin/python3 bench/bench_many.py [--tensors 5000] [--bytes 1024] [--repeats 7]

Blocked time is what a training loop waits: ckptdb, save() (the tree, one ckptdb_put_shards
call, the commit started) plus wait_capture; torch.save, the whole save. Each save is a new
version of one store whose ram tier (in /dev/shm) keeps 2 versions. Reported beside it, where a
ckptdb save's time goes: flattening the state into the tree record (Python and JSON), packing
the descriptors (Python, Store._put_many), the C call itself, and the wait for capture; and the
same save through one ckptdb_put_shard call a tensor (Store.put_shard), the path before the
batched put.
"""

import argparse
import gc
import json
import os
import shutil
import statistics
import tempfile
import time

import torch

import ckptdb.torch
from ckptdb import _capi


def median_ms(samples):
    return statistics.median(samples) * 1e3


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tensors", type=int, default=5000)
    parser.add_argument("--bytes", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    base = tempfile.mkdtemp(prefix="ckptdb-bench-many-", dir="/dev/shm")
    try:
        run(args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def run(args, base):
    elements = max(1, args.bytes // 4)
    state = {f"layers.{i}.weight": torch.randn(elements) for i in range(args.tensors)}
    total = args.tensors * elements * 4
    # Each tensor is its own record today (a 4 KiB header block and its payload padded to
    # 4 KiB): room for three versions of them, the two kept and one being captured.
    record = 4096 + -(-elements * 4 // 4096) * 4096
    arena = 3 * args.tensors * record + (64 << 20)
    ckpt = ckptdb.torch.Checkpointer(os.path.join(base, "root"),
                                     tiers=f"ram:{arena},keep=2,dir={base}", rank=0,
                                     world_size=1)
    store = ckpt.store
    torch_file = os.path.join(base, "state.pt")
    step = 0
    samples = {k: [] for k in ("torch", "ckptdb", "flatten", "pack+call", "call", "capture",
                               "per-tensor put")}
    # Interleaved: each repeat runs every configuration once, so drift hits all alike.
    for _ in range(args.repeats + 1):
        t = time.perf_counter()
        torch.save(state, torch_file)
        samples["torch"].append(time.perf_counter() - t)

        step += 1
        t = time.perf_counter()
        ckpt.save(step, state)
        t_saved = time.perf_counter()
        ckpt.wait_capture()
        t_captured = time.perf_counter()
        samples["ckptdb"].append(t_captured - t)
        samples["capture"].append(t_captured - t_saved)
        ckpt.wait(step)

        # The parts of a save, timed apart on a version of their own (the collector off, as
        # save() turns it off).
        step += 1
        gc.disable()
        t = time.perf_counter()
        tensors = []
        tree = ckpt._flatten(state, "", tensors)
        record = json.dumps({"format": 1, "rank": 0, "world_size": 1, "tree": tree},
                            separators=(",", ":"), allow_nan=False).encode("utf-8")
        t_flat = time.perf_counter()
        items = [(b"__ckptdb__/tree", *_capi.buffer_address(record), None, None, None, None,
                  _capi.PUT_COPY_NOW)]
        for name, tensor, _, code in tensors:  # as Checkpointer._save builds them
            items.append((name.encode("utf-8"), tensor.data_ptr(),
                          tensor.numel() * tensor.element_size(), tensor, code,
                          tensor.shape, None, None, 0))
        t_items = time.perf_counter()
        calls = []
        real = _capi._put_shards

        def timed(*a):
            c = time.perf_counter()
            rc = real(*a)
            calls.append(time.perf_counter() - c)
            return rc

        _capi._put_shards = timed
        try:
            store._put_many(step, items)
        finally:
            _capi._put_shards = real
        t_put = time.perf_counter()
        gc.enable()
        samples["flatten"].append(t_flat - t)
        samples["pack+call"].append(t_put - t_flat)
        samples["call"].append(calls[0])
        store.wait_capture(step)
        store.commit(step)

        # One put_shard call a tensor: the path before ckptdb_put_shards.
        step += 1
        t = time.perf_counter()
        store.put_shard(step, "__ckptdb__/tree", record, copy_now=True)
        for name, tensor, _, _ in tensors:
            store.put_shard(step, name, tensor)
        store.wait_capture(step)
        samples["per-tensor put"].append(time.perf_counter() - t)
        store.commit(step)
    ckpt.close()
    n = args.tensors
    med = {k: median_ms(v[1:]) for k, v in samples.items()}  # the first run warms up
    print(f"{n} tensors of {elements * 4} bytes ({total / 2**20:.1f} MiB), median of "
          f"{args.repeats} (ms):")
    print(f"  torch.save into tmpfs            {med['torch']:9.2f}")
    print(f"  ckptdb save + wait_capture       {med['ckptdb']:9.2f}   "
          f"{med['torch'] / med['ckptdb']:.1f}x less than torch.save, "
          f"{med['ckptdb'] * 1e3 / n:.2f} us a tensor")
    print(f"    flatten + tree record (Python) {med['flatten']:9.2f}   "
          f"{med['flatten'] * 1e3 / n:.2f} us a tensor")
    print(f"    descriptors + the C call       {med['pack+call']:9.2f}   "
          f"{med['pack+call'] * 1e3 / n:.2f} us a tensor")
    print(f"      of it ckptdb_put_shards      {med['call']:9.2f}   "
          f"{med['call'] * 1e3 / n:.2f} us a tensor")
    print(f"    wait_capture                   {med['capture']:9.2f}")
    print(f"  one put_shard a tensor + wait    {med['per-tensor put']:9.2f}   "
          f"{med['per-tensor put'] * 1e3 / n:.2f} us a tensor")


if __name__ == "__main__":
    main()
