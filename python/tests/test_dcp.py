"""PyTorch's distributed checkpoint (DCP) through ckptdb.torch.dcp (docs/python.md, "DCP"): the
save and load calls of Debian's torch 1.13 writing into and reading from ckptdb stores.

- One process (no_dist): a state of several dtypes, a non-contiguous view, a 0-dim tensor and
  plain values saves and loads bit for bit, the tensors overwritten right after the save returns
  (the default writer waits for capture inside it) or right after writer.wait_capture()
  (wait_capture=False); a failed save commits nothing; a reader given the wrong stores, version
  or a store without a DCP save is refused, naming what is wrong.
- A real job (python/tests/dcp_job.py): 2 ranks (gloo, and a ckptdb job of 2) save ShardedTensors
  split along dimension 0; 3 ranks load them split along dimension 1 (resharded), and 1 process
  loads them whole; every element checked.
"""

import importlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import unittest

import ckptdb

try:
    import torch

    from ckptdb.torch.dcp import dcp  # DCP itself, as import_dcp imports it
except ImportError:  # pragma: no cover - reported as a skip
    torch = None

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "dcp_job.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@unittest.skipIf(torch is None, f"no torch in {sys.executable}: install python3-torch")
class DcpOneProcessTest(unittest.TestCase):
    def setUp(self):
        from ckptdb.torch.dcp import StorageReader, StorageWriter  # noqa: PLC0415

        self.Reader, self.Writer = StorageReader, StorageWriter
        self.dir = tempfile.mkdtemp(prefix="ckptdb-test-dcp-", dir="/dev/shm")
        self.root = os.path.join(self.dir, "root")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def open(self, **kw):
        return ckptdb.Store(self.root, tiers="ram:256M,keep=2,dir=" + os.path.join(self.dir, "shm"),
                            **kw)

    def state(self, seed: int) -> dict:
        g = torch.Generator().manual_seed(seed)
        wide = torch.randn(40, 30, generator=g, dtype=torch.float64).to(torch.bfloat16)
        return {
            # Big enough that capture is still copying it when save returns without waiting
            # (the tests below fail then: checked by taking the wait out).
            "big": torch.randn(6 << 20, generator=g),
            "layer.w": torch.randn(300, 70, generator=g),
            "layer.t": wide.t(),  # a non-contiguous view
            "ids": torch.randint(-2**40, 2**40, (1000,), generator=g),
            "scale": torch.tensor(float(seed) + 0.25, dtype=torch.float64),
            "step": seed,
            "extra": {"lr": [0.1, 0.01], "note": "ok"},
        }

    def empty_like(self, state: dict) -> dict:
        return {k: (torch.zeros_like(v) if isinstance(v, torch.Tensor) else None)
                for k, v in state.items()}

    def check(self, loaded: dict, saved: dict):
        for k, v in saved.items():
            if isinstance(v, torch.Tensor):
                self.assertEqual(loaded[k].dtype, v.dtype, k)
                self.assertTrue(torch.equal(loaded[k], v), f"{k} differs")
            else:
                self.assertEqual(loaded[k], v, k)

    def test_a_save_is_the_callers_again_when_save_returns_and_loads_bit_for_bit(self):
        with self.open() as store:
            state = self.state(1)
            saved = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in state.items()}
            writer = self.Writer(store, version=4)
            dcp.save_state_dict(state, writer, no_dist=True)
            for v in state.values():  # the next optimizer step, at once
                if isinstance(v, torch.Tensor):
                    v.fill_(-7)
            writer.wait_commit()
            self.assertEqual(store.latest(), 4)
            names = {t.name for t in store.list(4)}
            self.assertIn("dcp/.metadata", names)
            self.assertIn("dcp/layer.w@0,0", names)
            loaded = self.empty_like(saved)
            dcp.load_state_dict(loaded, self.Reader(store, version=4), no_dist=True)
            self.check(loaded, saved)
        # Reopened, the newest version is read when none is given.
        with self.open() as store:
            loaded = self.empty_like(saved)
            dcp.load_state_dict(loaded, self.Reader(store), no_dist=True)
            self.check(loaded, saved)

    def test_without_waiting_for_capture_the_caller_waits_before_changing_its_tensors(self):
        with self.open() as store:
            state = self.state(2)
            saved = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in state.items()}
            writer = self.Writer(store, wait_capture=False)  # version: latest + 1 = 0
            dcp.save_state_dict(state, writer, no_dist=True)
            writer.wait_capture()
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    v.fill_(3)
            writer.wait_commit()
            self.assertEqual(writer.version, 0)
            loaded = self.empty_like(saved)
            dcp.load_state_dict(loaded, self.Reader(store, version=0), no_dist=True)
            self.check(loaded, saved)
            # A second save with no version given goes to latest + 1.
            writer = self.Writer(store)
            dcp.save_state_dict(self.state(3), writer, no_dist=True)
            writer.wait_commit()
            self.assertEqual(writer.version, 1)

    def test_saves_back_to_back_take_the_next_versions_while_commits_run(self):
        # The loop a trainer runs. Whether a commit is still running when the next save picks
        # its version is up to timing here (the rule that once asked the store's latest passed
        # this too); test_a_save_dcp_abandoned_is_aborted_by_the_next holds a version open for
        # certain.
        with self.open() as store:
            saved = []
            for seed in (6, 7, 8):  # no wait for capture or commit in between
                state = self.state(seed)
                writer = self.Writer(store, wait_capture=False)
                dcp.save_state_dict(state, writer, no_dist=True)
                saved.append((writer.version, {k: (v.clone() if isinstance(v, torch.Tensor)
                                                   else v) for k, v in state.items()}))
            self.assertEqual([v for v, _ in saved], [0, 1, 2])
            writer.wait_commit()
            for version, values in saved[1:]:  # keep=2: version 0 is retired by now
                loaded = self.empty_like(values)
                dcp.load_state_dict(loaded, self.Reader(store, version=version), no_dist=True)
                self.check(loaded, values)

    def test_a_load_converts_to_the_targets_dtype(self):
        with self.open() as store:
            g = torch.Generator().manual_seed(9)
            saved = {"w": torch.randn(64, 32, generator=g).to(torch.float16)}
            writer = self.Writer(store, version=1)
            dcp.save_state_dict(saved, writer, no_dist=True)
            writer.wait_commit()
            for dtype in (torch.float32, torch.bfloat16, torch.float64):
                loaded = {"w": torch.zeros(64, 32, dtype=dtype)}
                dcp.load_state_dict(loaded, self.Reader(store, version=1), no_dist=True)
                self.assertTrue(torch.equal(loaded["w"], saved["w"].to(dtype)), dtype)

    def test_a_save_dcp_abandoned_is_aborted_by_the_next(self):
        # Another rank's failure: torch then calls no finish, and this rank's version is left
        # open (put, not committed). The next save aborts it and goes on above it.
        planner_module = importlib.import_module(dcp.__name__ + ".planner")
        with self.open() as store:
            writer = self.Writer(store)
            writer.init(True)
            plan = writer.prepare_global_plan([planner_module.SavePlan(items=[])])[0]
            writer.write_data(plan, None)
            self.assertEqual(writer.version, 0)
            state = self.state(10)
            next_writer = self.Writer(store)
            dcp.save_state_dict(state, next_writer, no_dist=True)
            next_writer.wait_commit()
            self.assertEqual(next_writer.version, 1)
            self.assertEqual(store.latest(), 1)
            with self.assertRaises(ckptdb.StateError) as e:
                store.list(0)
            self.assertIn("ABORTED", str(e.exception))

    def test_a_failed_save_commits_nothing(self):
        with self.open() as store:
            state = self.state(4)
            state["x" * 2000] = torch.ones(3)  # a name over ckptdb's 1024 bytes
            with self.assertRaises(dcp.CheckpointException) as e:
                dcp.save_state_dict(state, self.Writer(store, version=1), no_dist=True)
            self.assertIn("InvalidError", str(e.exception))
            self.assertIn("is longer than 1024 bytes", str(e.exception))
            self.assertIsNone(store.latest(), "nothing of the failed save committed")
            with self.assertRaises(ckptdb.StateError) as e:
                store.list(1)
            self.assertIn("ABORTED", str(e.exception))

    def test_readers_are_refused_the_wrong_stores_versions_and_saves(self):
        other = ckptdb.Store(os.path.join(self.dir, "other"),
                             tiers="ram:16M,dir=" + os.path.join(self.dir, "shm2"))
        with self.open() as store, other:
            writer = self.Writer(store, version=2, rank=1)  # this store holds rank 1's save
            dcp.save_state_dict(self.state(5), writer, no_dist=True)
            writer.wait_commit()
            loaded = self.empty_like(self.state(5))
            # DCP wraps what a plugin raises in its CheckpointException, with the text.
            for reader, what in ((self.Reader(store, version=2), "holds rank 1's save"),
                                 (self.Reader(store, version=3), "NotFound"),
                                 (self.Reader(other, version=2), "no DCP save")):
                if reader._stores[0] is other and other.latest() is None:
                    other.put_shard(2, "plain", bytearray(8), copy_now=True)
                    other.commit(2)
                with self.assertRaises(dcp.CheckpointException) as e:
                    dcp.load_state_dict(loaded, reader, no_dist=True)
                self.assertIn(what, str(e.exception))
            with self.assertRaises(TypeError):
                self.Reader("not a store")
            with self.assertRaises(ckptdb.InvalidError):
                self.Writer(store, version=-1)


@unittest.skipIf(torch is None, f"no torch in {sys.executable}: install python3-torch")
class DcpJobTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="ckptdb-test-dcp-job-", dir="/dev/shm")
        master, coordinator = free_port(), free_port()
        procs = []
        for rank in range(2):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(master), CKPTDB_COORDINATOR=f"127.0.0.1:{coordinator}",
                       CKPTDB_JOB_TOKEN="dcp-test", CKPTDB_UCX_TLS="tcp")
            procs.append(subprocess.Popen([sys.executable, JOB, "save", "--dir", cls.dir],
                                          env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
        outputs = [p.communicate(timeout=300)[0] for p in procs]
        if any(p.returncode != 0 for p in procs):
            shutil.rmtree(cls.dir, ignore_errors=True)
            raise AssertionError("the saving job failed:\n" + "\n".join(outputs))
        cls.roots = [os.path.join(cls.dir, f"rank{r}") for r in range(2)]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def load_on(self, world: int, version: int):
        master = free_port()
        procs = []
        for rank in range(world):
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master))
            for key in ("CKPTDB_COORDINATOR", "CKPTDB_JOB_TOKEN", "RANK", "WORLD_SIZE"):
                env.pop(key, None)
            procs.append(subprocess.Popen(
                [sys.executable, JOB, "load", "--world", str(world), "--rank", str(rank),
                 "--version", str(version)] + self.roots,
                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outputs = [p.communicate(timeout=300)[0] for p in procs]
        self.assertEqual([p.returncode for p in procs], [0] * world, "\n".join(outputs))
        return outputs

    def test_a_two_rank_save_loads_resharded_on_three_ranks(self):
        for version in (1, 2):
            outputs = self.load_on(3, version)
            self.assertTrue(all(f"v{version} loaded bit for bit" in o for o in outputs), outputs)

    def test_a_two_rank_save_loads_whole_in_one_process(self):
        outputs = self.load_on(1, 2)
        self.assertIn("v2 loaded bit for bit", outputs[0])


if __name__ == "__main__":
    unittest.main()
