"""ckptdb.torch against torch.save / torch.load and DCP on one state dict, in one run
(docs/performance.md, "PyTorch: ckptdb.torch against torch.save and DCP").

    CKPTDB_LIBRARY=build/libckptdb.so PYTHONPATH=python \\
        /usr/bin/python3 bench/bench_torch.py [--gib 2] [--steps 8] [--dir /var/tmp/...]
        [--dcp-only [--dcp-gib 0.5]]

The state: a stack of 4096 x 4096 Linear layers and their Adam state after one step (the
parameters and two moments: 3 x 4 bytes a parameter), at least --gib GiB. It trains on synthetic
batches with torch on both cores, and measures:

- blocked time per save, the time the training loop cannot compute because of a checkpoint:
  torch.save (synchronous: all of it), DCP's save_state_dict (synchronous, one process), and
  ckptdb: save() (hands the tensors over and starts the commit) plus the wait in
  optimizer.step() for capture to finish, in a loop that checkpoints after every step;
- restore time: torch.load of the file torch.save wrote (new tensors), DCP's load_state_dict
  (in place), ckptdb.torch's load into the live state (in place) and into new tensors;
- step-time overhead: the loop's median iteration with a ckptdb checkpoint every step against
  the same loop without checkpoints. Capture copies the whole state every step on the same two
  cores that train.

torch.save and DCP write to --dir (a disk file system, through the page cache, not fsynced);
ckptdb commits each version to its ram tier (memory that outlives the process) and copies every
4th version to a disk tier in --dir in the background (fsynced). All reads are from memory: the
page cache for torch.load and DCP, the ram tier for ckptdb.

Debian's torch 1.13 has DCP as torch.distributed._shard.checkpoint, which does not import under
Python 3.11 (a dataclass with an unhashable default); ckptdb.torch.dcp.import_dcp imports it
with that one class made hashable, which changes nothing it does.
"""

import argparse
import dataclasses
import os
import shutil
import statistics
import sys
import time

import torch
from torch import nn

import ckptdb.torch


def import_dcp():
    from ckptdb.torch.dcp import dcp  # noqa: PLC0415 - import_dcp's shim for torch 1.13

    return dcp


def state_bytes(state) -> int:
    total = 0
    stack = [state]
    while stack:
        obj = stack.pop()
        if isinstance(obj, torch.Tensor):
            total += obj.numel() * obj.element_size()
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
    return total


def flat(state, prefix=""):
    """DCP 1.13 pickles nested containers as one blob: give it the tensors by name."""
    out = {}
    for key, value in state.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat(value, name + "."))
        elif isinstance(value, torch.Tensor):
            out[name] = value
    return out


def median_ms(samples):
    return statistics.median(samples) * 1e3


def background_cpus() -> str:
    """The CPUs for ckptdb's threads in the small loop: all but the first (the training thread's
    share), as a CPU list; "" on a machine of one CPU."""
    allowed = sorted(os.sched_getaffinity(0))
    return ",".join(str(c) for c in allowed[1:])


def small_loop(directory: str, ram_dir: str, steps: int):
    """The real client test's loop (python/tests/train.py: an MLP and a 2-layer transformer
    block, Adam, one thread): median step time without checkpoints, with a ckptdb checkpoint
    after every step (ram tier, commit asynchronous) whose threads run on the CPUs the training
    thread leaves (options.cpus, background_cpus()), and the same with ckptdb's threads on any
    CPU. The three interleaved, twice; the best of each."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python",
                                    "tests"))
    from train import Net, batch  # noqa: PLC0415

    cpus = background_cpus()
    results = {"plain": [], "cpus": [], "any": []}
    for config in ("plain", "cpus", "any") * 2:
        torch.manual_seed(1234)
        model = Net()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        ckpt = None
        if config != "plain":
            root = os.path.join(directory, f"small-{config}{len(results[config])}")
            ckpt = ckptdb.torch.Checkpointer(root, tiers=f"ram:64M,keep=2,dir={ram_dir}",
                                             rank=0, world_size=1,
                                             cpus=cpus if config == "cpus" else None)
            ckpt.hook(optimizer)
        times = []
        for step in range(1, steps + 1):
            t = time.perf_counter()
            x, y = batch(step)
            loss = (model(x) - y).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if ckpt is not None:
                ckpt.save(step, {"model": model.state_dict(), "optim": optimizer.state_dict(),
                                 "rng": torch.get_rng_state(), "step": step})
            times.append(time.perf_counter() - t)
        if ckpt is not None:
            ckpt.wait(steps)
            ckpt.close()
        results[config].append(statistics.median(times[steps // 10:]))  # past the warm-up
    state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    return {k: min(v) for k, v in results.items()}, cpus, state_bytes(state)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default="/var/tmp/ckptdb-bench-torch")
    parser.add_argument("--ram-dir", default="/dev/shm/ckptdb-bench-torch",
                        help="where ckptdb's ram tier keeps its arenas (removed at the end)")
    parser.add_argument("--small-steps", type=int, default=300,
                        help="steps of the real client test's small model (0: skip it)")
    parser.add_argument("--small-only", action="store_true",
                        help="only the real client test's small model (issue 23's step bar)")
    parser.add_argument("--dcp-only", action="store_true",
                        help="only DCP's save and load through ckptdb.torch.dcp against DCP's "
                             "FileSystemWriter/Reader into tmpfs (--dcp-gib of state)")
    parser.add_argument("--dcp-gib", type=float, default=0.5)
    parser.add_argument("--device", default="cpu",
                        help="cpu, or cuda: the model and its state on the GPU (needs torch with "
                             "CUDA and a CUDA build of libckptdb)")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch's threads (default: torch's own choice)")
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    try:
        return run(args)
    finally:
        # The ram tier's arena outlives the process by design: this run's are removed here.
        shutil.rmtree(args.dir, ignore_errors=True)
        shutil.rmtree(args.ram_dir, ignore_errors=True)


def run(args):
    for d in (args.dir, args.ram_dir):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    if args.small_only:
        print_small(*small_loop(args.dir, args.ram_dir, args.small_steps))
        return
    if args.dcp_only:
        return dcp_plugins(args)
    dcp = import_dcp()
    width = 4096
    per_layer = (width * width + width) * 4 * 3
    layers = max(1, -(-int(args.gib * 2**30) // per_layer))
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)]).to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    batch = torch.randn(16, width, device=args.device)

    def train_step():
        optimizer.zero_grad()
        model(batch).square().mean().backward()
        optimizer.step()
        if args.device != "cpu":
            torch.cuda.synchronize()  # a step's time is the GPU's

    train_step()  # Adam's moments exist from here on
    state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    total = state_bytes(state)
    gib = total / 2**30
    print(f"state: {layers} layers of {width} x {width}, {len(flat(state))} tensors, "
          f"{gib:.2f} GiB; torch threads {torch.get_num_threads()}")

    # -- step time without checkpoints --
    plain = []
    for _ in range(args.steps):
        t = time.perf_counter()
        train_step()
        plain.append(time.perf_counter() - t)

    # -- ckptdb: a checkpoint after every step --
    arena = int(2.5 * total) // 2**20
    root = os.path.join(args.dir, "ckptdb")
    ckpt = ckptdb.torch.Checkpointer(
        root, tiers=f"ram:{arena}M,keep=1,dir={args.ram_dir};disk:{root}/disk,every=4,keep=1",
        rank=0, world_size=1)
    waits = []
    original_wait = ckpt.wait_capture

    def timed_wait():
        t = time.perf_counter()
        original_wait()
        waits.append(time.perf_counter() - t)

    ckpt.wait_capture = timed_wait
    ckpt.hook(optimizer)
    saves, iterations, blocked = [], [], []
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        waited_before = len(waits)
        train_step()
        t1 = time.perf_counter()
        ckpt.save(step, state)
        t2 = time.perf_counter()
        iterations.append(t2 - t0)
        saves.append(t2 - t1)
        if step > 1:  # the wait in this step's optimizer.step() is for the previous save
            blocked.append(saves[-2] + sum(waits[waited_before:]))
    ckpt.wait(args.steps)
    waited_before = len(waits)
    ckpt.wait_capture()
    blocked.append(saves[-1] + sum(waits[waited_before:]))
    ckpt_blocked = median_ms(blocked)
    overhead = statistics.median(iterations) / statistics.median(plain) - 1

    # -- torch.save and DCP --
    torch_file = os.path.join(args.dir, "torch.pt")
    torch_save = []
    for _ in range(args.repeats):
        if os.path.exists(torch_file):
            os.remove(torch_file)
        t = time.perf_counter()
        torch.save(state, torch_file)
        torch_save.append(time.perf_counter() - t)
    flat_state = flat(state)
    dcp_save = []
    for i in range(args.repeats):
        path = os.path.join(args.dir, "dcp")
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)
        t = time.perf_counter()
        dcp.save_state_dict(flat_state, dcp.FileSystemWriter(path), no_dist=True)
        dcp_save.append(time.perf_counter() - t)

    # -- restores --
    torch_load = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        loaded = torch.load(torch_file)
        torch_load.append(time.perf_counter() - t)
        del loaded
    dcp_load = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        dcp.load_state_dict(flat_state, dcp.FileSystemReader(os.path.join(args.dir, "dcp")),
                            no_dist=True)
        dcp_load.append(time.perf_counter() - t)
    latest = ckpt.latest()
    ckpt_load, ckpt_load_new = [], []
    for _ in range(args.repeats):
        t = time.perf_counter()
        ckpt.load(latest, into=state)
        ckpt_load.append(time.perf_counter() - t)
    for _ in range(args.repeats):
        t = time.perf_counter()
        fresh = ckpt.load(latest)
        ckpt_load_new.append(time.perf_counter() - t)
        del fresh
    ckpt.close()
    shutil.rmtree(args.ram_dir, ignore_errors=True)  # its arena: memory the small loop needs
    os.makedirs(args.ram_dir)
    small = small_loop(args.dir, args.ram_dir, args.small_steps) if args.small_steps > 0 else None

    rate = lambda s: gib / statistics.median(s)  # noqa: E731
    print(f"step without checkpoints      {median_ms(plain):9.1f} ms (median of {len(plain)})")
    print(f"step + ckptdb save every step {median_ms(iterations):9.1f} ms: overhead "
          f"{overhead * 100:.1f}% (bar < 5%)")
    print(f"blocked per save: ckptdb      {ckpt_blocked:9.1f} ms (save() {median_ms(saves):.1f} ms "
          f"+ wait in optimizer.step() {median_ms(waits):.1f} ms; median of {len(blocked)})")
    print(f"blocked per save: torch.save  {median_ms(torch_save):9.1f} ms ({rate(torch_save):.2f} "
          f"GiB/s)  -> ckptdb {median_ms(torch_save) / ckpt_blocked:.0f}x less (bar >= 20x)")
    print(f"blocked per save: DCP         {median_ms(dcp_save):9.1f} ms ({rate(dcp_save):.2f} "
          f"GiB/s)  -> ckptdb {median_ms(dcp_save) / ckpt_blocked:.0f}x less (bar >= 10x)")
    print(f"restore: torch.load           {median_ms(torch_load):9.1f} ms ({rate(torch_load):.2f} "
          "GiB/s, new tensors)")
    print(f"restore: DCP load_state_dict  {median_ms(dcp_load):9.1f} ms ({rate(dcp_load):.2f} "
          "GiB/s, in place)")
    print(f"restore: ckptdb load in place {median_ms(ckpt_load):9.1f} ms ({rate(ckpt_load):.2f} "
          f"GiB/s)  -> {median_ms(torch_load) / median_ms(ckpt_load):.1f}x torch.load (bar >= 3x)")
    print(f"restore: ckptdb load, new     {median_ms(ckpt_load_new):9.1f} ms "
          f"({rate(ckpt_load_new):.2f} GiB/s)  -> "
          f"{median_ms(torch_load) / median_ms(ckpt_load_new):.1f}x torch.load")
    if small is not None:
        print_small(*small)
    return 0


def dcp_plugins(args):
    """DCP's own save and load calls through ckptdb.torch.dcp's StorageWriter/Reader, against
    DCP's FileSystemWriter/Reader into tmpfs (--ram-dir), in one run, the two alternating: the
    time a training loop is blocked per save, and the load. ckptdb's writer twice: waiting for
    capture inside the save (the default), and not (wait_capture=False), the forward and
    backward pass running before writer.wait_capture() and the optimizer step, as a loop would."""
    from ckptdb.torch.dcp import StorageReader, StorageWriter, dcp  # noqa: PLC0415

    width = 2048
    per_layer = (width * width + width) * 4 * 3
    layers = max(1, -(-int(args.dcp_gib * 2**30) // per_layer))
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    batch = torch.randn(16, width)

    def forward_backward():
        optimizer.zero_grad()
        model(batch).square().mean().backward()

    forward_backward()
    optimizer.step()
    state = flat({"model": model.state_dict(), "optim": optimizer.state_dict()})
    gib = state_bytes(state) / 2**30
    print(f"DCP: {layers} layers of {width} x {width} and their Adam state, {len(state)} "
          f"tensors, {gib:.2f} GiB, one process; FileSystemWriter into {args.ram_dir} (tmpfs)")
    store = ckptdb.Store(os.path.join(args.dir, "dcp-ckptdb"),
                         tiers=f"ram:{int(2.5 * gib * 1024) + 64}M,keep=1,dir={args.ram_dir}")
    files = os.path.join(args.ram_dir, "dcp-files")
    blocked = {"FileSystemWriter": [], "ckptdb, capture waited in save": [],
               "ckptdb, capture waited before step": []}
    loads = {"FileSystemReader": [], "ckptdb StorageReader": []}
    version = 0
    for _ in range(args.repeats):
        forward_backward()
        optimizer.step()
        shutil.rmtree(files, ignore_errors=True)
        os.makedirs(files)
        t = time.perf_counter()
        dcp.save_state_dict(state, dcp.FileSystemWriter(files), no_dist=True)
        blocked["FileSystemWriter"].append(time.perf_counter() - t)
        for wait in (True, False):
            forward_backward()
            optimizer.step()
            version += 1
            writer = StorageWriter(store, version=version, wait_capture=wait)
            t = time.perf_counter()
            dcp.save_state_dict(state, writer, no_dist=True)
            saved = time.perf_counter() - t
            if wait:
                blocked["ckptdb, capture waited in save"].append(saved)
            else:
                forward_backward()  # the next step's passes overlap the copy
                t = time.perf_counter()
                writer.wait_capture()
                blocked["ckptdb, capture waited before step"].append(
                    saved + time.perf_counter() - t)
                optimizer.step()
            writer.wait_commit()
        t = time.perf_counter()
        dcp.load_state_dict(state, dcp.FileSystemReader(files), no_dist=True)
        loads["FileSystemReader"].append(time.perf_counter() - t)
        t = time.perf_counter()
        dcp.load_state_dict(state, StorageReader(store, version=version), no_dist=True)
        loads["ckptdb StorageReader"].append(time.perf_counter() - t)
    store.close()
    shutil.rmtree(files, ignore_errors=True)
    base = median_ms(blocked["FileSystemWriter"])
    for name, samples in blocked.items():
        ms = median_ms(samples)
        print(f"blocked per save, {name:36s} {ms:8.1f} ms ({gib / (ms / 1e3):.2f} GiB/s)  "
              f"{ms / base:.3f} of FileSystemWriter's (bar <= 0.2), median of {len(samples)}")
    base = median_ms(loads["FileSystemReader"])
    for name, samples in loads.items():
        ms = median_ms(samples)
        print(f"load, {name:47s} {ms:8.1f} ms ({gib / (ms / 1e3):.2f} GiB/s)  "
              f"{ms / base:.3f} of FileSystemReader's")
    return 0


def print_small(steps: dict, cpus: str, small_bytes: int) -> None:
    plain = steps["plain"]
    print(f"the real client test's model ({small_bytes / 2**10:.0f} KiB of state, 1 thread): "
          f"step {plain * 1e3:.2f} ms; with a ckptdb save every step:")
    print(f"  ckptdb's threads on CPUs {cpus or '(any: one CPU)'} (options.cpus): "
          f"{steps['cpus'] * 1e3:.2f} ms, overhead {(steps['cpus'] / plain - 1) * 100:.0f}% "
          "(bar < 20%)")
    print(f"  ckptdb's threads on any CPU:       {steps['any'] * 1e3:.2f} ms, overhead "
          f"{(steps['any'] / plain - 1) * 100:.0f}%")


if __name__ == "__main__":
    sys.exit(main())
