"""The real client (issue 7): a PyTorch training loop checkpointing every step through
ckptdb.torch, SIGKILLed at a random step, restarted from its latest checkpoint, ends with the
same parameters and optimizer state, bit for bit, as a run never interrupted; the same for a
job of 4 processes under torch.distributed (gloo) with one of them killed; and the
Checkpointer's tree keeps every kind of value exactly. Skipped, saying so, where the interpreter
has no torch (Debian's python3-torch; `make test` installs it).
"""

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


if __name__ == "__main__":
    unittest.main()
