"""A small training run for the real-client test (python/tests/test_torch.py): an MLP and a
2-layer transformer block, Adam, synthetic data drawn from the step number, dropout drawing
from torch's global generator, all on one CPU thread with deterministic algorithms, so two runs
of the same steps end bit for bit equal.

    train.py --steps N --out FILE [--root DIR --tiers SPEC [--kill-at K]]

With --root it checkpoints every step through ckptdb.torch (asynchronously; the optimizer
hook waits for capture), resumes from the latest checkpoint if there is one, and with --kill-at
SIGKILLs itself right after handing step K's checkpoint over. At the end it writes the final
parameters and optimizer state with torch.save to FILE, and the step it resumed from to
FILE.resumed.
"""

import argparse
import os
import signal

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))
        layer = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, dropout=0.1,
                                           batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        return self.head(self.blocks(self.mlp(x))).mean(dim=(1, 2))


def batch(step: int):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(8, 4, 16, generator=g), torch.randn(8, generator=g)


def resume(ckpt, model, optimizer) -> int:
    """Loads the latest checkpoint, if any, into the model, the optimizer and torch's generator;
    returns the first step still to train."""
    latest = ckpt.latest()
    if latest is None:
        return 1
    state = ckpt.load(latest, into={"model": model.state_dict()})
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optim"])
    torch.set_rng_state(state["rng"])
    return state["step"] + 1


def checkpoint(ckpt, step: int, model, optimizer, kill_at: int) -> None:
    """Hands step's state to ckptdb (asynchronously); at kill_at, dies right after."""
    ckpt.save(step, {"model": model.state_dict(), "optim": optimizer.state_dict(),
                     "rng": torch.get_rng_state(), "step": step})
    if step == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)


def finish(out: str, model, optimizer) -> None:
    torch.save({"model": model.state_dict(), "optim": optimizer.state_dict()}, out)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--root")
    parser.add_argument("--tiers")
    parser.add_argument("--kill-at", type=int, default=0)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(1234)
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    start = 1
    ckpt = None
    if args.root:
        import ckptdb.torch  # noqa: PLC0415 - run A never imports ckptdb

        ckpt = ckptdb.torch.Checkpointer(args.root, tiers=args.tiers, rank=0, world_size=1)
        start = resume(ckpt, model, optimizer)
        ckpt.hook(optimizer)
    with open(args.out + ".resumed", "w") as f:
        f.write(str(start - 1))

    for step in range(start, args.steps + 1):
        x, y = batch(step)
        loss = ((model(x) - y) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if ckpt is not None:
            checkpoint(ckpt, step, model, optimizer, args.kill_at)
    if ckpt is not None:
        ckpt.wait(args.steps)
        ckpt.close()
    finish(args.out, model, optimizer)


if __name__ == "__main__":
    main()
