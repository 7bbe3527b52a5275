"""Resharding (issue 7): a state saved by a job of 4 ranks, its tensors split along different
dimensions (unevenly), loads on 2 ranks, 1 rank and 3 ranks with other splits through
ckptdb.torch.load_sharded, every element checked (python/tests/reshard_job.py); roots that are
not one whole job, and targets that do not match what was saved, are refused clearly."""

import json
import os
import shutil
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
JOB = os.path.join(HERE, "reshard_job.py")


@unittest.skipIf(torch is None, f"no torch in {sys.executable}: install python3-torch")
class ReshardTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="ckptdb-test-", dir="/dev/shm")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = []
        for rank in range(4):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE="4",
                       CKPTDB_COORDINATOR=f"127.0.0.1:{port}", CKPTDB_JOB_TOKEN="reshard-test",
                       CKPTDB_UCX_TLS="tcp", CKPTDB_NODE_ID=f"node{rank}")
            procs.append(subprocess.Popen([sys.executable, JOB, "save", "--dir", cls.dir],
                                          env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
        outputs = [p.communicate(timeout=300)[0] for p in procs]
        if any(p.returncode != 0 for p in procs):
            shutil.rmtree(cls.dir, ignore_errors=True)
            raise AssertionError("the saving job failed:\n" + "\n".join(outputs))
        cls.roots = [os.path.join(cls.dir, f"rank{r}") for r in range(4)]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def load_on(self, world, split, roots=None):
        procs = [subprocess.Popen([sys.executable, JOB, "load", "--world", str(world), "--rank",
                                   str(rank), "--split", str(split)] + (roots or self.roots),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for rank in range(world)]
        outputs = [p.communicate(timeout=300)[0] for p in procs]
        self.assertEqual([p.returncode for p in procs], [0] * world, "\n".join(outputs))
        return outputs

    def test_a_four_rank_save_loads_on_two_ranks(self):
        for split in (0, 1):
            self.load_on(2, split)

    def test_a_four_rank_save_loads_on_one_rank(self):
        self.load_on(1, 0)

    def test_a_four_rank_save_loads_on_three_ranks_split_otherwise(self):
        self.load_on(3, 1)

    def test_the_roots_in_any_order_are_the_same_job(self):
        self.load_on(2, 1, list(reversed(self.roots)))

    def test_roots_that_are_not_one_whole_job_are_refused(self):
        import ckptdb.torch
        from ckptdb.torch import Shard

        into = {"model": {"w1": Shard(torch.zeros(6, 10), (12, 10), (0, 0))}}
        with self.assertRaisesRegex(ValueError, r"job of 4 ranks; the roots given hold ranks "
                                                r"\[0, 1, 3\], not \[2\]"):
            ckptdb.torch.load_sharded([self.roots[0], self.roots[1], self.roots[3]], into)
        with self.assertRaisesRegex(ValueError, "both hold rank 1"):
            ckptdb.torch.load_sharded(self.roots + [self.roots[1]], into)

    def test_targets_that_do_not_match_the_save_are_refused(self):
        import ckptdb.torch
        from ckptdb.torch import Shard

        cases = [
            ({"model": {"w1": Shard(torch.zeros(6, 10, dtype=torch.float64), (12, 10), (0, 0))}},
             "saved as f32, the target is torch.float64"),
            ({"model": {"w1": Shard(torch.zeros(6, 10), (12, 11), (0, 0))}},
             r"saved with global shape \(12, 10\), wanted \(12, 11\)"),
            ({"model": {"w1": torch.zeros(6, 10)}},
             r"saved with global shape \(12, 10\), wanted \(6, 10\)"),
            ({"model": {"nothing": 0}}, "no value at /model/nothing"),
            ({"model": {"nothing": torch.zeros(3)}}, "no tensor at /model/nothing"),
            ({"model": {"w1": 0}}, "saved as a tensor"),
        ]
        for into, message in cases:
            with self.subTest(message=message):
                with self.assertRaisesRegex((ValueError, KeyError), message):
                    ckptdb.torch.load_sharded(self.roots, into)

    def test_a_refused_load_writes_no_tensor(self):
        import ckptdb.torch
        from ckptdb.torch import Shard

        first = torch.zeros(6, 10)
        into = {"model": {"w1": Shard(first, (12, 10), (0, 0)),
                          "w2": Shard(torch.zeros(3, 20), (6, 21), (0, 0))}}
        with self.assertRaisesRegex(ValueError, "saved with global shape"):
            ckptdb.torch.load_sharded(self.roots, into)
        self.assertTrue(torch.equal(first, torch.zeros(6, 10)), "w1 was written")

    def test_a_box_across_every_saved_shard_reads_them_all_and_nothing_else(self):
        import ckptdb.torch
        from ckptdb.torch import Shard

        sys.path.insert(0, HERE)
        import reshard_job  # noqa: PLC0415

        # Version 2 (not the latest), one 3 x 3 box in the middle of w1 (saved split along dim 0
        # at 0, 4, 6, 9, 12: the box meets ranks 1 and 2 only).
        target = Shard(torch.zeros(3, 3), (12, 10), (5, 4))
        got = ckptdb.torch.load_sharded(self.roots, {"model": {"w1": target}}, step=2)
        want = reshard_job.global_tensor("model/w1", 2)[5:8, 4:7]
        self.assertTrue(torch.equal(got["model"]["w1"].tensor, want))


    def test_a_checkpointer_loads_a_box_of_its_own_shards(self):
        import ckptdb.torch
        from ckptdb.torch import Shard

        root = os.path.join(self.dir, "alone")
        piece = torch.arange(40, dtype=torch.float32).reshape(4, 10)
        with ckptdb.torch.Checkpointer(root, rank=0, world_size=1) as ckpt:
            ckpt.save(1, {"w": Shard(piece, (8, 10), (4, 0))})
            ckpt.wait(1)
            self.assertIsInstance(ckpt.load(1)["w"], Shard)
            got = ckpt.load_sharded({"w": Shard(torch.zeros(2, 3), (8, 10), (5, 2))})
            self.assertTrue(torch.equal(got["w"].tensor, piece[1:3, 2:5]))
            with self.assertRaisesRegex(ValueError, "hold 6 of the 12 elements"):
                ckpt.load_sharded({"w": Shard(torch.zeros(2, 6), (8, 10), (3, 2))})


NFS_FIXTURE = os.environ.get("CKPTDB_NFS_FIXTURE")


@unittest.skipIf(torch is None, f"no torch in {sys.executable}: install python3-torch")
@unittest.skipIf(not NFS_FIXTURE, "CKPTDB_NFS_FIXTURE is not set (ctest sets it)")
class ReshardFromNfsTest(unittest.TestCase):
    """Issue 24: a job of 4 ranks saves to a ram tier and one shared nfs tier on a real NFS
    server (tests/support/nfs_server.h); then every rank's root goes (ram arena, catalog, all)
    and another job, of another number of ranks, loads from the nfs directory alone."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="ckptdb-test-", dir="/var/tmp")
        export = os.path.join(cls.dir, "export")
        work = os.path.join(cls.dir, "server")
        os.makedirs(export)
        os.makedirs(work)
        cls.server = subprocess.Popen([NFS_FIXTURE, export, work], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True)
        line = cls.server.stdout.readline().split()
        if len(line) != 2:
            cls.stop_server()
            raise AssertionError(f"the nfs fixture did not start (it printed {line})")
        cls.spec = (f"nfs:127.0.0.1:{export}/ck,port={line[0]},mountport={line[1]}")
        cls.nfs_dir = os.path.join(export, "ck")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        jobdir = os.path.join(cls.dir, "job")
        procs = []
        for rank in range(4):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE="4",
                       CKPTDB_COORDINATOR=f"127.0.0.1:{port}", CKPTDB_JOB_TOKEN="nfs-test",
                       CKPTDB_UCX_TLS="tcp", CKPTDB_NODE_ID=f"node{rank}")
            procs.append(subprocess.Popen([sys.executable, JOB, "save", "--dir", jobdir,
                                           "--nfs", cls.spec], env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
        outputs = [p.communicate(timeout=300)[0] for p in procs]
        if any(p.returncode != 0 for p in procs):
            cls.stop_server()
            shutil.rmtree(cls.dir, ignore_errors=True)
            raise AssertionError("the saving job failed:\n" + "\n".join(outputs))
        # No surviving ram, no local disk, no catalog: only the nfs directory is left.
        shutil.rmtree(jobdir)

    @classmethod
    def stop_server(cls):
        cls.server.stdin.close()
        cls.server.wait(timeout=60)

    @classmethod
    def tearDownClass(cls):
        cls.stop_server()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def load_on(self, world, split):
        procs = [subprocess.Popen([sys.executable, JOB, "load", "--world", str(world), "--rank",
                                   str(rank), "--split", str(split), "--tiers", self.spec],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for rank in range(world)]
        outputs = [p.communicate(timeout=300)[0] for p in procs]
        self.assertEqual([p.returncode for p in procs], [0] * world, "\n".join(outputs))

    def test_the_directory_holds_every_ranks_witness_and_rank_0s_decisions(self):
        commits = sorted(os.listdir(os.path.join(self.nfs_dir, "commits")))
        self.assertEqual(commits, [f"v{v:020d}-r{r:05d}.commit" for v in (1, 2, 3)
                                   for r in range(4)])
        self.assertEqual(sorted(os.listdir(os.path.join(self.nfs_dir, "decisions"))),
                         [f"v{v:020d}.decision" for v in (1, 2, 3)])

    def test_loads_on_two_ranks_and_three_from_the_nfs_tier_alone(self):
        self.load_on(2, 0)
        self.load_on(3, 1)

    def test_an_older_version_reads_back_as_a_box(self):
        import ckptdb.torch
        from ckptdb.torch import Shard

        sys.path.insert(0, HERE)
        import reshard_job  # noqa: PLC0415

        target = Shard(torch.zeros(3, 3), (12, 10), (5, 4))
        got = ckptdb.torch.load_sharded(None, {"model": {"w1": target}}, step=2, tiers=self.spec)
        self.assertTrue(torch.equal(got["model"]["w1"].tensor,
                                    reshard_job.global_tensor("model/w1", 2)[5:8, 4:7]))

    def test_export_merge_reads_the_nfs_tier_alone(self):
        cli = os.environ.get("CKPTDB_CLI")
        if not cli:
            self.skipTest("CKPTDB_CLI is not set (ctest sets it)")
        sys.path.insert(0, HERE)
        import reshard_job  # noqa: PLC0415

        out = os.path.join(self.dir, "merged.safetensors")
        r = subprocess.run([cli, "export", "--tiers", self.spec, "--merge", "--out", out],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        tensors, _meta = read_safetensors(out)
        w1 = reshard_job.global_tensor("model/w1", 3)
        name = [n for n in tensors if n.endswith("w1")]
        self.assertEqual(len(name), 1, sorted(tensors))
        self.assertTrue(torch.equal(tensors[name[0]], w1))


def read_safetensors(path):
    """An independent reader of the safetensors format (the spec, not ckptdb's code): the
    header, the metadata and every tensor."""
    import json
    import struct

    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    metadata = header.pop("__metadata__", {})
    dtypes = {"F32": torch.float32, "F64": torch.float64, "BF16": torch.bfloat16,
              "I64": torch.int64, "U8": torch.uint8, "F16": torch.float16, "I32": torch.int32}
    tensors = {}
    end = 0
    for name, entry in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        begin, stop = entry["data_offsets"]
        assert begin == end, f"{name} starts at {begin}, not {end}"
        end = stop
        raw = bytearray(data[8 + n + begin:8 + n + stop])
        t = torch.frombuffer(raw, dtype=dtypes[entry["dtype"]]) if raw else torch.empty(
            0, dtype=dtypes[entry["dtype"]])
        tensors[name] = t.reshape(entry["shape"])
    assert 8 + n + end == len(data), "bytes after the last tensor"
    return tensors, metadata


def write_safetensors(path, tensors, metadata=None, mangle=None):
    """An independent writer; `mangle(header)` spoils the header for the refusal tests."""
    import json
    import struct

    names = {torch.float32: "F32", torch.int64: "I64", torch.bfloat16: "BF16"}
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        raw = t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    if mangle:
        mangle(header)
    text = json.dumps(header).encode("utf-8")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


@unittest.skipIf(torch is None, f"no torch in {sys.executable}: install python3-torch")
class SafetensorsTest(unittest.TestCase):
    """ckptdb export and import (docs/cli.md), checked by an independent reader and writer."""

    @classmethod
    def setUpClass(cls):
        ReshardTest.setUpClass.__func__(cls)
        sys.path.insert(0, HERE)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def cli(self, *args):
        return subprocess.run([os.environ.get("CKPTDB_CLI", "ckptdb")] + list(args),
                              capture_output=True, text=True, timeout=120)

    def test_a_merged_export_holds_every_global_tensor(self):
        import reshard_job

        out = os.path.join(self.dir, "merged.safetensors")
        r = self.cli("export", *self.roots, "--merge", "--format", "safetensors", "--out", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        tensors, metadata = read_safetensors(out)
        self.assertEqual(metadata["ckptdb.version"], "3")
        for name in reshard_job.TENSORS:
            self.assertTrue(torch.equal(tensors["/" + name], reshard_job.global_tensor(name, 3)),
                            name)
        self.assertTrue(torch.equal(tensors["/model/bias"], torch.arange(10.0) * 3))
        self.assertNotIn("__ckptdb__/tree", tensors)
        self.assertFalse([n for n in tensors if "__ckptdb__" in n])
        # Nothing is overwritten; a missing rank is named, and no file is left.
        r = self.cli("export", *self.roots, "--merge", "--out", out)
        self.assertEqual(r.returncode, 2)
        self.assertIn("already exists", r.stderr)
        partial = os.path.join(self.dir, "partial.safetensors")
        r = self.cli("export", *self.roots[:3], "--merge", "--version", "2", "--out", partial)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("is a rank's root missing?", r.stderr)
        self.assertEqual(sorted(f for f in os.listdir(self.dir) if "partial" in f), [])

    def test_one_ranks_export_imports_back_as_the_same_shards(self):
        import ckptdb
        import ckptdb.torch

        out = os.path.join(self.dir, "rank2.safetensors")
        r = self.cli("export", *self.roots, "--rank", "2", "--version", "2", "--out", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        tensors, metadata = read_safetensors(out)
        self.assertEqual(metadata["ckptdb.rank"], "2")
        self.assertEqual(json.loads(metadata["ckptdb.raw"]), {"__ckptdb__/tree": []})
        root = os.path.join(self.dir, "imported")
        r = self.cli("import", out, "--root", root, "--version", "2")
        self.assertEqual(r.returncode, 0, r.stderr)
        with ckptdb.Store(root, rank=0, world_size=1) as store:
            with ckptdb.Store(self.roots[2], rank=0, world_size=1, read_only=True) as original:
                saved = {t.name: t for t in original.list(2)}
            for t in store.list(2):
                self.assertEqual((t.dtype, t.shape, t.global_shape, t.global_offset),
                                 (saved[t.name].dtype, saved[t.name].shape,
                                  saved[t.name].global_shape, saved[t.name].global_offset),
                                 t.name)
            self.assertEqual(sorted(saved), sorted(t.name for t in store.list(2)))
        # The tree came along: ckptdb.torch loads the import as rank 2's state.
        with ckptdb.torch.Checkpointer(root, rank=0, world_size=1) as ckpt:
            state = ckpt.load(2)
        self.assertEqual(state["step"], 2)
        self.assertTrue(torch.equal(state["model"]["w1"].tensor, tensors["/model/w1"]))

    def test_an_independent_file_imports_and_bad_files_change_nothing(self):
        import ckptdb

        good = {"a": torch.arange(12, dtype=torch.float32).reshape(3, 4),
                "b": torch.tensor([2**40, -3], dtype=torch.int64),
                "c": torch.ones(2, 2, dtype=torch.bfloat16)}
        path = os.path.join(self.dir, "hand.safetensors")
        write_safetensors(path, good, {"format": "pt"})
        root = os.path.join(self.dir, "hand")
        r = self.cli("import", path, "--root", root, "--version", "5")
        self.assertEqual(r.returncode, 0, r.stderr)
        with ckptdb.Store(root, rank=0, world_size=1) as store:
            for name, t in good.items():
                out = torch.empty_like(t)
                store.restore(5, name, out)
                self.assertTrue(torch.equal(out, t), name)

        def spoil(key, value):
            return lambda h: h[key].__setitem__(*value) if isinstance(value, tuple) else \
                h.__setitem__(key, value)

        cases = [
            ("overlap", spoil("b", ("data_offsets", [40, 56])), "(an overlap)"),
            ("size", spoil("a", ("data_offsets", [0, 44])),
             "of F32 is 48 bytes, its data_offsets 44 bytes"),
            ("huge", spoil("a", ("shape", [2**62])),
             "of F32 is 2^64 bytes or more, its data_offsets 48 bytes"),
            ("hole", lambda h: (h["b"].__setitem__("data_offsets", [52, 68]),
                                h["c"].__setitem__("data_offsets", [68, 76])), "(a hole)"),
            ("dtype", spoil("a", ("dtype", "F31")), 'unknown dtype "F31"'),
            ("shape", spoil("a", ("shape", [3, -4])), "is not unsigned"),
            ("meta", spoil("__metadata__", {"ckptdb.shards": "{\"a\": 3}"}),
             "ckptdb.shards 'a': not {global_shape, global_offset}"),
        ]
        for label, mangle, message in cases:
            with self.subTest(label):
                bad = os.path.join(self.dir, f"bad-{label}.safetensors")
                write_safetensors(bad, good, {"format": "pt"}, mangle)
                r = self.cli("import", bad, "--root", root, "--version", "6")
                self.assertNotEqual(r.returncode, 0)
                self.assertIn(message, r.stderr)
                self.assertIn("nothing was imported", r.stderr)
        with open(path, "rb") as f:
            data = f.read()
        # A header nested 100,000 deep: refused, not a stack overflow in printing it.
        nested = (b'{"a": {"dtype": ' + b"[" * 100000 + b"]" * 100000 +
                  b', "shape": [1], "data_offsets": [0, 1]}}')
        deep = len(nested).to_bytes(8, "little") + nested + b"x"
        for label, spoilt in [("cut4", data[:4]), ("cut20", data[:20]), ("cut", data[:-1]),
                              ("extra", data + bytes(8)), ("deep", deep)]:
            bad = os.path.join(self.dir, f"{label}.safetensors")
            with open(bad, "wb") as f:
                f.write(spoilt)
            r = self.cli("import", bad, "--root", root, "--version", "6")
            self.assertEqual(r.returncode, 1, r.stderr)
            if label == "extra":
                self.assertIn("the tensors fill 72 bytes of a 80-byte buffer", r.stderr)
        with ckptdb.Store(root, rank=0, world_size=1) as store:
            self.assertEqual(store.latest(), 5)  # version 6 never appeared
            with self.assertRaises(ckptdb.NotFound):
                store.list(6)


    def test_import_refuses_what_a_put_would_before_making_any_store(self):
        # Each used to exit 2 (or, for the NUL, import 'a' silently) and leave an empty store
        # at ROOT; now: exit 1, the name shown escaped, and no ROOT.
        t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
        shards = json.dumps({"a": {"global_shape": [2, 4], "global_offset": [1, 0]}})
        cases = [
            ("nul", {"a\x00b": t}, None, "'a\\x00b': its name holds a NUL byte"),
            ("empty", {"": t}, None, "a tensor has an empty name"),
            ("long", {"n" * 1100: t}, None, "its name is 1100 bytes"),
            ("reserved", {"@aor:x": t}, None, "are ckptdb's own"),
            ("sharded", {"a": t}, {"ckptdb.shards": shards}, "outside the global size 2"),
        ]
        for label, tensors, metadata, message in cases:
            with self.subTest(label):
                path = os.path.join(self.dir, f"refused-{label}.safetensors")
                write_safetensors(path, tensors, metadata)
                root = os.path.join(self.dir, f"never-{label}")
                r = self.cli("import", path, "--root", root, "--version", "1")
                self.assertEqual(r.returncode, 1, r.stderr)
                self.assertIn(message, r.stderr)
                self.assertIn("nothing was imported", r.stderr)
                self.assertFalse(os.path.exists(root), "a refused import made a store")
                self.assertLess(len(r.stderr), 1000, r.stderr)
        # Refused at the open (a tier spec that does not parse): the root it made is removed;
        # one that was there before stays.
        path = os.path.join(self.dir, "open-fails.safetensors")
        write_safetensors(path, {"a": t})
        root = os.path.join(self.dir, "never-opened")
        r = self.cli("import", path, "--root", root, "--version", "1", "--tiers", "nonsense:/x")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("nonsense", r.stderr)
        self.assertFalse(os.path.exists(root), "the root the failed import made is still there")
        os.makedirs(root)
        r = self.cli("import", path, "--root", root, "--version", "1", "--tiers", "nonsense:/x")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertTrue(os.path.isdir(root), "a directory that was there before was removed")
        # Version 0 is a version (the API takes it); 2**64 - 1 is reserved.
        path = os.path.join(self.dir, "v0.safetensors")
        write_safetensors(path, {"a": t})
        root = os.path.join(self.dir, "v0")
        r = self.cli("import", path, "--root", root, "--version", "0")
        self.assertEqual(r.returncode, 0, r.stderr)
        r = self.cli("import", path, "--root", root, "--version", str(2**64 - 1))
        self.assertEqual(r.returncode, 2, r.stderr)
        # A version the store has passed is the caller's mistake (exit 2); the store stays.
        r = self.cli("import", path, "--root", root, "--version", "0")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertTrue(os.path.exists(root))


if __name__ == "__main__":
    unittest.main()
