"""REFT's AOR (issue 25): a keeper's recomputed replica of another rank's Adam or AdamW shard is
that shard bit for bit, and a rank whose node is lost restores its optimizer state from it
(python/tests/aor_job.py; ckptdb_declare_replicas "aor", CKPTDB_PUT_RECOMPUTED)."""

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
JOB = os.path.join(HERE, "aor_job.py")

CONFIGS = [
    {},
    {"weight_decay": 0.05, "amsgrad": True},
    {"lr": 3e-2, "betas": (0.8, 0.95), "eps": 1e-6, "maximize": True},
]


def bits(t):
    """A float32 tensor's bits, so that -0.0 and NaN payloads count too."""
    return t.detach().contiguous().view(torch.int32)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@unittest.skipIf(torch is None, f"no torch in {sys.executable}: install python3-torch")
class RecomputedOptimizerTest(unittest.TestCase):
    def zero1(self, kind, hyper, steps=30, ranks=3, sizes=(1000, 37, 513)):
        """A ZeRO-1 group in one process: rank r steps its third of the flat parameters with
        `kind` (its shard a view at an odd offset of its own buffer), rank r - 1 keeps it with a
        RecomputedOptimizer, both from the same gradients. Returns the pairs (owner's, keeper's)
        of every state tensor and parameter after `steps`."""
        from ckptdb.torch import RecomputedOptimizer, optimizer_shards

        g = torch.Generator().manual_seed(3)
        flat = torch.randn(sum(sizes), generator=g)
        b = [flat.numel() * r // ranks for r in range(ranks + 1)]
        owners, optims, keepers = [], [], []
        for r in range(ranks):
            buffer = torch.zeros(b[r + 1] - b[r] + 5)
            p = torch.nn.Parameter(buffer[5:])
            with torch.no_grad():
                p.copy_(flat[b[r]:b[r + 1]])
            owners.append(p)
            optims.append(kind([p], **hyper))
            keepers.append(RecomputedOptimizer(kind, [flat[b[r]:b[r + 1]]], **hyper))
        for step in range(1, steps + 1):
            grad = torch.sin(flat * step) + 0.1 * torch.randn(flat.shape, generator=g)
            if step % 7 == 0:
                grad[b[1] + 3] = -0.0  # a signed zero must survive as one
            for r in range(ranks):
                owners[r].grad = grad[b[r]:b[r + 1]].clone()
                optims[r].step()
                keepers[r].step([grad[b[r]:b[r + 1]]])
            flat = torch.cat([p.detach() for p in owners])
        pairs = []
        for r in range(ranks):
            mine, theirs = optimizer_shards(optims[r]), keepers[r].shards()
            self.assertEqual(sorted(mine), sorted(theirs))
            pairs += [(f"rank {r} {name}", mine[name], theirs[name]) for name in mine]
            pairs.append((f"rank {r} params", owners[r], keepers[r].params[0]))
        return pairs

    def test_the_recomputed_shard_is_the_owners_bit_for_bit(self):
        for kind in (torch.optim.Adam, torch.optim.AdamW):
            for hyper in CONFIGS:
                with self.subTest(kind=kind.__name__, **hyper):
                    for name, a, b in self.zero1(kind, hyper):
                        self.assertEqual(a.shape, b.shape, name)
                        self.assertTrue(torch.equal(bits(a), bits(b)), name)

    def test_a_learning_rate_schedule_is_followed(self):
        """The owner's LambdaLR schedule, followed by the keeper before each step: equal bit for
        bit; not followed, the keeper diverges."""
        from ckptdb.torch import RecomputedOptimizer

        for follow in (True, False):
            g = torch.Generator().manual_seed(5)
            p = torch.nn.Parameter(torch.randn(300, generator=g))
            owner = torch.optim.AdamW([p], lr=1e-2)
            schedule = torch.optim.lr_scheduler.LambdaLR(owner, lambda s: 0.9 ** s)
            keeper = RecomputedOptimizer(torch.optim.AdamW, [p], lr=1e-2)
            for _ in range(10):
                p.grad = torch.randn(300, generator=g)
                if follow:
                    keeper.follow(lr=owner.param_groups[0]["lr"])
                keeper.step([p.grad])
                owner.step()
                schedule.step()
            self.assertEqual(torch.equal(bits(p), bits(keeper.params[0])), follow)
        with self.assertRaises(ValueError):
            keeper.follow(amsgrad=True)

    def test_a_different_update_is_not_equal(self):
        """The check can fail: a keeper built with another learning rate diverges at once."""
        from ckptdb.torch import RecomputedOptimizer

        p = torch.nn.Parameter(torch.randn(64))
        owner = torch.optim.Adam([p], lr=1e-3)
        keeper = RecomputedOptimizer(torch.optim.Adam, [p], lr=1.001e-3)
        p.grad = torch.randn(64)
        keeper.step([p.grad])
        owner.step()
        self.assertFalse(torch.equal(bits(p), bits(keeper.params[0])))

    def test_what_cannot_be_repeated_is_refused(self):
        from ckptdb.torch import RecomputedOptimizer, optimizer_shards

        p = torch.zeros(4)
        with self.assertRaises(TypeError):
            RecomputedOptimizer(torch.optim.SGD, [p], lr=0.1)
        with self.assertRaises(ValueError):
            RecomputedOptimizer(torch.optim.Adam, [p], foreach=True)
        with self.assertRaises(TypeError):
            RecomputedOptimizer(torch.optim.Adam, [p.double()])
        with self.assertRaises(ValueError):
            RecomputedOptimizer(torch.optim.Adam, [p], betas=(1.5, 0.9))  # torch's own check
        keeper = RecomputedOptimizer(torch.optim.Adam, [p])
        with self.assertRaises(ValueError):
            keeper.step([torch.zeros(5)])
        with self.assertRaises(ValueError):
            keeper.step([])
        with self.assertRaises(TypeError):
            optimizer_shards(torch.optim.SGD([torch.nn.Parameter(p)], lr=0.1))


@unittest.skipIf(torch is None, f"no torch in {sys.executable}: install python3-torch")
class AorJobTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="ckptdb-test-aor-", dir="/dev/shm")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def run_job(self, *args):
        coordinator, master = free_port(), free_port()
        procs = []
        for rank in range(3):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE="3", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(master), CKPTDB_COORDINATOR=f"127.0.0.1:{coordinator}",
                       CKPTDB_JOB_TOKEN="aor-test", CKPTDB_UCX_TLS="tcp",
                       CKPTDB_HEARTBEAT_MS="100", CKPTDB_DEAD_AFTER_MS="3000")
            cmd = [sys.executable, JOB, *args, "--dir", self.dir, "--out",
                   os.path.join(self.dir, f"out.{args[0]}.{rank}")]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
        try:
            outputs = [p.communicate(timeout=300)[0] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        self.assertEqual([p.returncode for p in procs], [0] * 3, "\n".join(outputs))
        return [torch.load(os.path.join(self.dir, f"out.{args[0]}.{rank}")) for rank in range(3)]

    def test_a_lost_rank_restores_its_adamw_state_from_its_keeper_bit_for_bit(self):
        steps = 6
        trained = self.run_job("train", "--steps", str(steps), "--adamw")
        for rank in range(3):
            self.assertEqual(trained[rank]["differing"], [], f"rank {rank}'s keeper diverged")
        # Node 1 is lost with everything on it; the job restarts on a replacement.
        shutil.rmtree(os.path.join(self.dir, "node1"))
        restored = self.run_job("restore", "--step", str(steps))
        for rank in range(3):
            self.assertEqual(restored[rank]["latest"], steps)
            for key in ("step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
                want = trained[rank]["state"][f"optim/0/{key}"]
                got = restored[rank][key]
                self.assertTrue(torch.equal(bits(want), bits(got)), f"rank {rank}: {key}")
        # Node 0, rank 1's keeper, is lost too: rank 1's state is gone, and said to be.
        shutil.rmtree(os.path.join(self.dir, "node0"))
        lost = self.run_job("restore", "--step", str(steps), "--expect-lost")
        self.assertIsNone(lost[1]["latest"])
        self.assertIsNotNone(lost[1]["error"])
        self.assertIn("recomputed replica", lost[1]["error"])


if __name__ == "__main__":
    unittest.main()
