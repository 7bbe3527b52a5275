"""The real client (issue 7): a PyTorch training loop checkpointing every step through
ckptdb.torch, SIGKILLed at a random step, restarted from its latest checkpoint, ends with the
same parameters and optimizer state, bit for bit, as a run never interrupted; the same for a
job of 4 processes under torch.distributed (gloo) with one of them killed; and the
Checkpointer's tree keeps every kind of value exactly. Skipped, saying so, where the interpreter
has no torch (Debian's python3-torch; `make test` installs it).
"""

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import unittest

try:
    import torch
except ImportError:  # pragma: no cover - reported as a skip
    torch = None

HERE = os.path.dirname(os.path.abspath(__file__))


@unittest.skipIf(torch is None, f"no torch in {sys.executable}: install python3-torch")
class TorchTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="ckptdb-test-", dir="/dev/shm")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def train(self, out, *extra):
        cmd = [sys.executable, os.path.join(HERE, "train.py"), "--steps", "30", "--out", out]
        return subprocess.run(cmd + list(extra), capture_output=True, text=True, timeout=300)

    def test_a_run_killed_at_a_random_step_ends_bit_for_bit_as_one_never_interrupted(self):
        a = os.path.join(self.dir, "a.pt")
        done = self.train(a)
        self.assertEqual(done.returncode, 0, done.stderr)
        b = os.path.join(self.dir, "b.pt")
        root = os.path.join(self.dir, "store")
        tiers = f"ram:32M,keep=2,dir={self.dir}/shm;disk:{self.dir}/disk,every=5,keep=2"
        kill_at = random.Random().randint(5, 25)
        killed = self.train(b, "--root", root, "--tiers", tiers, "--kill-at", str(kill_at))
        self.assertEqual(killed.returncode, -9, f"not killed at step {kill_at}: {killed.stderr}")
        self.assertFalse(os.path.exists(b))
        resumed = self.train(b, "--root", root, "--tiers", tiers)
        self.assertEqual(resumed.returncode, 0, resumed.stderr)
        with open(b + ".resumed") as f:
            start = int(f.read())
        print(f"killed at step {kill_at}, resumed from step {start}", file=sys.stderr)
        self.assertGreaterEqual(start, kill_at - 2, "an asynchronous commit or two may be lost")
        self.assertLessEqual(start, kill_at)
        want, got = torch.load(a), torch.load(b)
        for name, tensor in want["model"].items():
            self.assertTrue(torch.equal(tensor, got["model"][name]), name)
        self.assertEqual(want["optim"]["param_groups"], got["optim"]["param_groups"])
        self.assertEqual(sorted(want["optim"]["state"]), sorted(got["optim"]["state"]))
        for index, state in want["optim"]["state"].items():
            for key, value in state.items():
                self.assertTrue(torch.equal(value, got["optim"]["state"][index][key]),
                                f"optimizer state {index}.{key}")

    def run_job(self, out, job_dir=None, kill_rank=None, kill_at=0):
        """Runs the 4 ranks of train_dist.py; with kill_rank, waits for that rank's SIGKILL
        and then kills the others (they hang in an all-reduce), as a scheduler does."""
        ports = []
        for _ in range(2):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                ports.append(s.getsockname()[1])
        procs = []
        for rank in range(4):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE="4", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(ports[0]), CKPTDB_COORDINATOR=f"127.0.0.1:{ports[1]}",
                       CKPTDB_JOB_TOKEN="torch-test", CKPTDB_UCX_TLS="tcp",
                       CKPTDB_HEARTBEAT_MS="100", CKPTDB_DEAD_AFTER_MS="5000")
            cmd = [sys.executable, os.path.join(HERE, "train_dist.py"), "--steps", "20",
                   "--out", f"{out}.{rank}"]
            if job_dir:
                cmd += ["--dir", job_dir]
            if rank == kill_rank:
                cmd += ["--kill-at", str(kill_at)]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
        try:
            if kill_rank is not None:
                procs[kill_rank].wait(timeout=300)
                for p in procs:
                    if p.poll() is None:
                        p.send_signal(signal.SIGKILL)
            outputs = [p.communicate(timeout=300)[0] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        return [p.returncode for p in procs], outputs

    def test_a_job_of_four_ranks_with_one_killed_resumes_bit_for_bit(self):
        a = os.path.join(self.dir, "a.pt")
        codes, outputs = self.run_job(a)
        self.assertEqual(codes, [0] * 4, "\n".join(outputs))
        b = os.path.join(self.dir, "b.pt")
        job = os.path.join(self.dir, "job")
        kill_at = random.Random().randint(4, 15)
        codes, outputs = self.run_job(b, job, kill_rank=2, kill_at=kill_at)
        self.assertEqual(codes[2], -9, f"rank 2 was not killed at step {kill_at}: {outputs[2]}")
        codes, outputs = self.run_job(b, job)
        self.assertEqual(codes, [0] * 4, "\n".join(outputs))
        starts = set()
        for rank in range(4):
            with open(f"{b}.{rank}.resumed") as f:
                starts.add(int(f.read()))
        self.assertEqual(len(starts), 1, f"the ranks resumed from different steps: {starts}")
        start = starts.pop()
        print(f"4 ranks: rank 2 killed at step {kill_at}, the job resumed from step {start}",
              file=sys.stderr)
        self.assertGreaterEqual(start, kill_at - 2)
        self.assertLessEqual(start, kill_at)
        for rank in range(4):
            want, got = torch.load(f"{a}.{rank}"), torch.load(f"{b}.{rank}")
            for name, tensor in want["model"].items():
                self.assertTrue(torch.equal(tensor, got["model"][name]), f"rank {rank}: {name}")
            for index, state in want["optim"]["state"].items():
                for key, value in state.items():
                    self.assertTrue(torch.equal(value, got["optim"]["state"][index][key]),
                                    f"rank {rank}: optimizer state {index}.{key}")

    def test_the_tree_keeps_every_kind_of_value_exactly(self):
        import ckptdb.torch

        state = {
            "w": torch.arange(12, dtype=torch.float32).reshape(3, 4),
            "t": torch.arange(12, dtype=torch.int64).reshape(3, 4).t(),  # not contiguous
            "bf": torch.ones(5, dtype=torch.bfloat16),
            "flags": torch.tensor([True, False]),
            "scalar": torch.tensor(2.5, dtype=torch.float64),
            "nested": {3: [1, 2.0, float("nan"), -float("inf"), None, True, "s/x%y"],
                       "pair": (1 << 70, -0.0)},
        }
        root = os.path.join(self.dir, "tree")
        with ckptdb.torch.Checkpointer(root, tiers=f"tmpfs:{self.dir}/t", rank=0,
                                       world_size=1) as ckpt:
            ckpt.save(1, state)
            ckpt.wait(1)
            self.assertEqual(ckpt.latest(), 1)
            into = {"w": torch.zeros(3, 4)}
            loaded = ckpt.load(into=into)
        self.assertIs(loaded["w"], into["w"], "restored in place")
        for key in ("w", "t", "bf", "flags", "scalar"):
            self.assertEqual(loaded[key].dtype, state[key].dtype, key)
            self.assertTrue(torch.equal(loaded[key], state[key]), key)
        nested = loaded["nested"]
        self.assertEqual(list(nested), [3, "pair"])
        values = nested[3]
        self.assertEqual(values[:2], [1, 2.0])
        self.assertTrue(values[2] != values[2])  # NaN
        self.assertEqual(values[3:], [-float("inf"), None, True, "s/x%y"])
        self.assertEqual(nested["pair"], (1 << 70, -0.0))
        self.assertEqual(str(nested["pair"][1]), "-0.0")
        with ckptdb.torch.Checkpointer(os.path.join(self.dir, "refuse"),
                                       tiers=f"tmpfs:{self.dir}/t2", rank=0, world_size=1) as c:
            with self.assertRaises(TypeError):
                c.save(1, {"x": object()})
            self.assertIsNone(c.latest(), "a refused save commits nothing")

    def native_and_python(self, ckpt, state):
        """The tree record and the descriptors of `state` from the native walk and from the
        Python walk, decoded alike: (record, [(name, address, nbytes, dtype, shape, global
        shape, offset, flags)])."""
        import ctypes
        import ckptdb.torch
        from ckptdb import _capi

        buffer, descs_at, count, keep, devices = ckptdb.torch._native.walk(
            state, ckpt.rank, ckpt.world_size, ckpt._leaf)
        self.assertEqual(devices, [])
        descs = (_capi._Shard * count).from_address(descs_at)
        native = []
        for d in descs:
            if d.info:
                i = d.info.contents
                n = i.ndim
                dims = (i.dtype, tuple(i.shape[:n]), tuple(i.global_shape[:n]),
                        tuple(i.global_offset[:n]))
            else:
                dims = (None, None, (), ())
            native.append((d.name, d.data or 0, d.nbytes, *dims, d.flags))
        record = ctypes.string_at(descs[0].data, descs[0].nbytes)
        self.assertEqual(len(keep), count - 1, "every tensor is held until capture ends")
        items = ckpt._walk_in_python(state)
        python = []
        for name, address, nbytes, _, code, shape, global_shape, offset, flags in items:
            n = len(shape) if shape is not None else 0
            python.append((name, address, nbytes, code, tuple(shape) if shape is not None else None,
                           tuple(global_shape or (0,) * n), tuple(offset or (0,) * n), flags))
        python_record = ctypes.string_at(items[0][1], items[0][2])
        del buffer
        return record, native, python_record, python

    def test_the_native_walk_writes_what_the_python_walk_writes(self):
        import collections
        import ckptdb.torch

        if not ckptdb.torch.NATIVE:
            if os.environ.get("CKPTDB_EXPECT_NATIVE") == "1":
                self.fail("ckptdb._native was built but not loaded")
            self.skipTest("ckptdb._native is not built (python3-dev)")
        import enum

        class Key(str, enum.Enum):  # str(Key.A) is "Key.A", its JSON text "a"
            A = "a"

        base = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
        odd = collections.OrderedDict([("b", torch.ones(2)), ("a", torch.zeros(3))])
        odd.move_to_end("b")  # an OrderedDict's order, not its underlying dict's
        state = {
            "w": base,
            "t": base.transpose(0, 2),  # not contiguous: copied, and the copy held
            "dtypes": [torch.ones(3, dtype=d) for d in ckptdb.torch._TORCH_DTYPES],
            "empty": torch.empty(0, 5), "scalar": torch.tensor(7.5),
            "shard": ckptdb.torch.Shard(torch.ones(2, 3), [4, 9], [2, 6]),
            "odd": odd, "": {"": torch.ones(1)},
            "esc/ap%e": {"\u00e9\u4e2d\U0001f600\x7f\x01\n\t\"\\": torch.ones(1)},
            7: {-3: (1 << 80, -(1 << 70), 0, True, False, None)},
            "values": ["s\u00e9\ud800", 1.5, float("nan"), float("inf"), -0.0, 5e-324, []],
            "tuple": (), "dict": {},
            "keys": {Key.A: torch.ones(1), "\ud800": 1},  # a str subclass; a lone surrogate
            # Negative views: memory holding the values before the negation (resolved, copied).
            "neg": [torch._neg_view(torch.tensor([5.0, 6.0])),
                    torch.tensor([1 + 2j], dtype=torch.complex64).conj().imag],
        }
        ckpt = ckptdb.torch.Checkpointer(os.path.join(self.dir, "walk"),
                                         tiers=f"tmpfs:{self.dir}/w", rank=0, world_size=1)
        for rank, world in ((0, 1), (3, 8)):
            with self.subTest(rank=rank):
                ckpt.rank, ckpt.world_size = rank, world  # the record's, not the store's
                try:
                    record, native, python_record, python = self.native_and_python(ckpt, state)
                    self.assertEqual(record, python_record)
                    # The record and the copy of the transposed tensor are new in each walk:
                    # their addresses differ, all else is the same.
                    moved = [i for i, (a, b) in enumerate(zip(native, python)) if a[1] != b[1]]
                    self.assertEqual([native[i][0] for i in moved],
                                     [b"__ckptdb__/tree", b"/t", b"/neg/0", b"/neg/1"])
                    self.assertIn(b"/keys/Key.A", [n[0] for n in native])
                    for i in moved:
                        native[i] = native[i][:1] + native[i][2:]
                        python[i] = python[i][:1] + python[i][2:]
                    self.assertEqual(native, python)
                    self.assertEqual(len(native), 1 + 2 + 10 + 3 + 2 + 1 + 1 + 1 + 2)  # record 1st
                    # A record the Python walk's reader takes as it is.
                    self.assertEqual(json.loads(record)["rank"], rank)
                finally:
                    ckpt.rank, ckpt.world_size = 0, 1
        ckpt.close()

    def test_the_native_walk_refuses_what_the_python_walk_refuses(self):
        import ckptdb.torch

        if not ckptdb.torch.NATIVE:
            self.skipTest("ckptdb._native is not built (python3-dev)")
        loop = {}
        loop["self"] = loop
        cases = [
            ({"c": {"x": torch.ones(2, dtype=torch.complex64)}}, TypeError,
             "/c/x: tensors of torch.complex64 are not supported"),
            ({"m": torch.ones(2, device="meta")}, ValueError,
             "/m: a tensor on meta; move it to the CPU"),
            ({"k": {1.5: torch.ones(1)}}, TypeError, "/k: a key of type float"),
            ({"k": {True: 1}}, TypeError, "/k: a key of type bool"),
            ({"a\0b": torch.ones(1)}, ValueError, "contains a NUL byte"),
            ({"o": [object()]}, TypeError, "/o/0: a object is not a tensor"),
            ({"d": torch.ones([1] * 9)}, ValueError, "at most 8 dimensions"),
            (loop, RecursionError, ""),
            ({"\ud800": torch.ones(1)}, UnicodeEncodeError, "surrogates not allowed"),
        ]
        root = os.path.join(self.dir, "refuse")
        with ckptdb.torch.Checkpointer(root, tiers=f"tmpfs:{self.dir}/r", rank=0,
                                       world_size=1) as ckpt:
            for state, error, text in cases:
                with self.subTest(text=text or error.__name__):
                    with self.assertRaises(error) as caught:
                        ckpt.save(1, state)
                    self.assertIn(text, str(caught.exception))
            self.assertIsNone(ckpt.latest(), "a refused save commits nothing")
            # The same store still saves, and pickles where it is allowed to.
            ckpt.allow_pickle = True
            ckpt.save(2, {"o": [collections_counter()], "w": torch.ones(3)})
            ckpt.wait(2)
            loaded = ckpt.load(2)
        self.assertEqual(loaded["o"][0], collections_counter())
        self.assertTrue(torch.equal(loaded["w"], torch.ones(3)))

    def test_a_save_put_in_batches_as_it_walks_is_whole_or_nothing(self):
        """The native walk puts 1,024 tensors a call while it walks: a save of 2,600 is four
        puts (the record last) and loads whole; a save refused after its first puts (a bad
        tensor late in the walk, or a put that fails) aborts the version, leaves nothing, and the
        same step can be saved again."""
        import ckptdb.torch
        from ckptdb import _capi

        if not ckptdb.torch.NATIVE:
            self.skipTest("ckptdb._native is not built (python3-dev)")
        self.assertEqual(ckptdb.torch._PUT_BATCH, 1024)
        base = torch.arange(6.0).reshape(2, 3)
        state = {f"w{i}": torch.full((3,), float(i)) for i in range(2600)}
        state["t"] = base.t()  # not contiguous: its copy is held by the walk only
        state["n"] = {"k": [torch.ones(4, dtype=torch.int64), 7]}
        root = os.path.join(self.dir, "batches")
        with ckptdb.torch.Checkpointer(root, tiers=f"tmpfs:{self.dir}/b", rank=0,
                                       world_size=1) as ckpt:
            late = dict(state)
            late["zz"] = torch.ones(2, dtype=torch.complex64)  # walked after two puts
            with self.assertRaises(TypeError):
                ckpt.save(1, late)
            long_name = dict(state)
            long_name["y" * 1100] = torch.ones(1)  # refused by the third put
            with self.assertRaises(_capi.InvalidError) as caught:
                ckpt.save(1, long_name)
            self.assertIn("longer than 1024 bytes", str(caught.exception))
            self.assertIsNone(ckpt.latest(), "a refused save commits nothing")
            ckpt.save(1, state)  # the same step, saved again
            ckpt.wait(1)
            self.assertEqual(len(ckpt.store.list(1)), 2600 + 2 + 1)  # and the record
            loaded = ckpt.load(1)
        for i in (0, 1023, 1024, 2047, 2048, 2599):
            self.assertTrue(torch.equal(loaded[f"w{i}"], state[f"w{i}"]), i)
        self.assertTrue(torch.equal(loaded["t"], base.t()))
        self.assertTrue(torch.equal(loaded["n"]["k"][0], torch.ones(4, dtype=torch.int64)))
        self.assertEqual(loaded["n"]["k"][1], 7)

    def test_a_negative_view_is_saved_as_it_reads(self):
        """A tensor whose negation is a lazy bit (is_neg(): complex.conj().imag, which is
        contiguous when it has one element) keeps the values before the negation in memory:
        both walks save the values it reads as."""
        import ckptdb.torch

        views = {"a": torch._neg_view(torch.tensor([5.0, 6.0])),
                 "b": torch.tensor([1 + 2j], dtype=torch.complex64).conj().imag}
        self.assertTrue(views["b"].is_neg() and views["b"].is_contiguous())
        saved = ckptdb.torch._native
        for native in (saved, None):
            ckptdb.torch._native = native
            try:
                with ckptdb.torch.Checkpointer(os.path.join(self.dir, f"neg{native is None}"),
                                               tiers=f"tmpfs:{self.dir}/n{native is None}",
                                               rank=0, world_size=1) as ckpt:
                    ckpt.save(1, views)
                    ckpt.wait(1)
                    loaded = ckpt.load(1)
            finally:
                ckptdb.torch._native = saved
            self.assertEqual(loaded["a"].tolist(), [-5.0, -6.0], native)
            self.assertEqual(loaded["b"].tolist(), [-2.0], native)
        # Loaded into a negative view: not in place (its memory would read negated), a new
        # tensor with the values saved.
        with ckptdb.torch.Checkpointer(os.path.join(self.dir, "negTrue"),
                                       tiers=f"tmpfs:{self.dir}/nTrue", rank=0,
                                       world_size=1) as ckpt:
            into = {"a": torch._neg_view(torch.zeros(2))}
            loaded = ckpt.load(1, into=into)
            self.assertIsNot(loaded["a"], into["a"])
            self.assertEqual(loaded["a"].tolist(), [-5.0, -6.0])
            with self.assertRaises(ValueError) as caught:
                ckpt.store.put_shard(2, "raw", torch._neg_view(torch.ones(2)))
            self.assertIn("negative or conjugate view", str(caught.exception))

    def test_the_python_walk_still_saves_and_loads(self):
        import ckptdb.torch

        state = {"w": torch.arange(6.0).reshape(2, 3), "n": {"i": 3, "l": [torch.ones(2)]}}
        saved = ckptdb.torch._native
        ckptdb.torch._native = None
        try:
            with ckptdb.torch.Checkpointer(os.path.join(self.dir, "py"),
                                           tiers=f"tmpfs:{self.dir}/p", rank=0,
                                           world_size=1) as ckpt:
                ckpt.save(1, state)
                ckpt.wait(1)
                loaded = ckpt.load(1)
        finally:
            ckptdb.torch._native = saved
        self.assertTrue(torch.equal(loaded["w"], state["w"]))
        self.assertEqual(loaded["n"]["i"], 3)
        self.assertTrue(torch.equal(loaded["n"]["l"][0], torch.ones(2)))


def collections_counter():
    import collections
    return collections.Counter("abracadabra")


if __name__ == "__main__":
    unittest.main()
