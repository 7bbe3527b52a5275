"""Many small tensors (issue 23): the blocked time of a ckptdb.torch save of N tensors of 1 KiB
against torch.save of the same dict into tmpfs, in one run (docs/performance.md, "Many small
tensors").

    CKPTDB_LIBRARY=build/libckptdb.so PYTHONPATH=python \\
        /usr/bin/python3 bench/bench_many.py [--tensors 5000] [--bytes 1024] [--repeats 7]

Blocked time is what a training loop waits: ckptdb, save() (the tree, one ckptdb_put_shards
call, the commit started) plus wait_capture; torch.save, the whole save. Each save is a new
version of one store whose ram tier (in /dev/shm) keeps 2 versions. Reported beside it, where a
ckptdb save's time goes: the native walk (ckptdb._native: the tree record and the descriptors in
one pass), the C call itself and the wait for capture; the same save with the walk in Python
(what runs where ckptdb._native is not built), and its parts: flattening the state into the
tree record (Python and JSON), packing the descriptors (Store._put_many) and the C call; and the
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
    samples = {k: [] for k in ("torch", "ckptdb", "python walk save", "walk", "call",
                               "capture", "flatten", "pack+call", "python call",
                               "per-tensor put")}
    real = _capi._put_shards
    calls = []

    def timed(*a):
        c = time.perf_counter()
        rc = real(*a)
        calls.append(time.perf_counter() - c)
        return rc

    native = ckptdb.torch._native
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

        # The same save with the walk in Python (what runs without ckptdb._native).
        step += 1
        ckptdb.torch._native = None
        try:
            t = time.perf_counter()
            ckpt.save(step, state)
            ckpt.wait_capture()
            samples["python walk save"].append(time.perf_counter() - t)
        finally:
            ckptdb.torch._native = native
        ckpt.wait(step)

        # The parts of a save, timed apart on versions of their own (the collector off, as
        # save() turns it off): the native walk and the C call; the Python walk's flatten and
        # JSON, and its descriptors and the C call.
        if native is not None:
            step += 1
            gc.disable()
            t = time.perf_counter()
            buffer, descs_at, count, keep, _ = native.walk(state, 0, 1, ckpt._leaf)
            t_walk = time.perf_counter()
            calls.clear()
            _capi._put_shards = timed
            try:
                store._put_described(step, buffer, descs_at, count, keep)
            finally:
                _capi._put_shards = real
            gc.enable()
            samples["walk"].append(t_walk - t)
            samples["call"].append(calls[0])
            store.wait_capture(step)
            store.commit(step)

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
        for name, tensor, _, code in tensors:  # as Checkpointer._walk_in_python builds them
            items.append((name.encode("utf-8"), tensor.data_ptr(),
                          tensor.numel() * tensor.element_size(), tensor, code,
                          tensor.shape, None, None, 0))
        calls.clear()
        _capi._put_shards = timed
        try:
            store._put_many(step, items)
        finally:
            _capi._put_shards = real
        t_put = time.perf_counter()
        gc.enable()
        samples["flatten"].append(t_flat - t)
        samples["pack+call"].append(t_put - t_flat)
        samples["python call"].append(calls[0])
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
    med = {k: median_ms(v[1:]) for k, v in samples.items() if v}  # the first run warms up

    def row(label, key, ratio=False):
        extra = f"   {med['torch'] / med[key]:.1f}x less than torch.save" if ratio else ""
        print(f"  {label:<40}{med[key]:9.2f}   {med[key] * 1e3 / n:.2f} us a tensor{extra}")

    print(f"{n} tensors of {elements * 4} bytes ({total / 2**20:.1f} MiB), median of "
          f"{args.repeats} (ms); native walk {'built' if native else 'NOT built'}:")
    row("torch.save into tmpfs", "torch")
    row("ckptdb save + wait_capture", "ckptdb", ratio=True)
    if native is not None:
        row("  native walk (tree record, descriptors)", "walk")
        row("  ckptdb_put_shards", "call")
    print(f"    wait_capture                            {med['capture']:9.2f}")
    row("the same, the walk in Python", "python walk save", ratio=True)
    row("  flatten + tree record (Python)", "flatten")
    row("  descriptors + the C call (Python)", "pack+call")
    row("    of it ckptdb_put_shards", "python call")
    row("one put_shard a tensor + wait", "per-tensor put")


if __name__ == "__main__":
    main()
