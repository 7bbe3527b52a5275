"""ckptdb for PyTorch training loops (docs/python.md, "ckptdb.torch").

    ckpt = ckptdb.torch.Checkpointer("/var/lib/ckpt", tiers="ram:8G,keep=2;disk:/nvme/ck")
    ckpt.hook(optimizer)                  # waits for capture right before optimizer.step()
    for step in range(start, steps + 1):
        loss = model(batch(step)).sum(); loss.backward()
        optimizer.step(); optimizer.zero_grad()
        ckpt.save(step, {"model": model.state_dict(), "optim": optimizer.state_dict(),
                         "rng": torch.get_rng_state(), "step": step})

`save` returns once every tensor is handed to ckptdb (no copy on the caller's thread: capture
copies them in the background while the next forward and backward pass runs) and the commit is
asynchronous. The live tensors must not change until capture is done: `hook(optimizer)` makes
`optimizer.step()` wait for it first (DataStates-LLM's integration point), and `wait_capture()`
does it by hand.

What is not a tensor is kept exactly, in the version's tree (a JSON record stored with it):
dicts (str or int keys), lists, tuples, int, float (bit for bit, as float.hex), bool, str, None.
Anything else raises TypeError, unless the Checkpointer was made with allow_pickle=True.
"""

import base64
import json
import os
import pickle
from typing import Any, List, Optional, Tuple

import torch

from ckptdb._capi import DTYPES, Store

_TREE = "__ckptdb__/tree"
_TREE_FORMAT = 1

_TORCH_DTYPES = {
    torch.bool: "bool", torch.uint8: "u8", torch.int8: "i8", torch.int16: "i16",
    torch.int32: "i32", torch.int64: "i64", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.float32: "f32", torch.float64: "f64",
}
_FROM_NAME = {name: dtype for dtype, name in _TORCH_DTYPES.items()}


def _rank_and_world(rank: Optional[int], world_size: Optional[int]) -> Tuple[int, int]:
    if rank is not None and world_size is not None:
        return rank, world_size
    import torch.distributed as dist  # noqa: PLC0415 - only when the caller did not say
    if dist.is_available() and dist.is_initialized():
        return (dist.get_rank() if rank is None else rank,
                dist.get_world_size() if world_size is None else world_size)
    return (int(os.environ.get("RANK", "0")) if rank is None else rank,
            int(os.environ.get("WORLD_SIZE", "1")) if world_size is None else world_size)


def _escape(key: str) -> str:
    return key.replace("%", "%25").replace("/", "%2F")


class Checkpointer:
    """A rank's checkpoints of a training job. `root` is this rank's store; with world_size > 1
    the job's options (coordinator, job_token, node_id) come from the arguments or the
    environment (CKPTDB_COORDINATOR, CKPTDB_JOB_TOKEN, ...; docs/api.md). Rank and world size
    come from torch.distributed when it is initialized, else RANK and WORLD_SIZE."""

    def __init__(self, root: str, *, tiers: Optional[str] = None,
                 redundancy: Optional[str] = None, rank: Optional[int] = None,
                 world_size: Optional[int] = None, allow_pickle: bool = False, **store_options):
        self.rank, self.world_size = _rank_and_world(rank, world_size)
        self.allow_pickle = allow_pickle
        self.store = Store(root, tiers=tiers, redundancy=redundancy, rank=self.rank,
                           world_size=self.world_size, **store_options)
        self._capturing: List[int] = []  # versions whose tensors capture may still read

    # -- lifetime --

    def close(self) -> None:
        """Waits for capture, then closes the store (pending commits complete first)."""
        if self.store is not None:
            self.wait_capture()
            self.store.close()
            self.store = None

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- saving --

    def save(self, step: int, state: Any) -> None:
        """Checkpoints `state` (a nested dict/list of tensors and plain values) as version `step`
        and starts its commit; returns without waiting for either."""
        if step < 1:
            raise ValueError(f"step {step}: versions start at 1")
        tensors: List[Tuple[str, torch.Tensor]] = []
        tree = self._flatten(state, "", tensors)
        record = json.dumps({"format": _TREE_FORMAT, "tree": tree}, separators=(",", ":"),
                            allow_nan=False).encode("utf-8")
        self.store.put_shard(step, _TREE, bytearray(record), copy_now=True)
        for name, tensor in tensors:
            self.store.put_shard(step, name, tensor, dtype=_TORCH_DTYPES[tensor.dtype],
                                 shape=tuple(tensor.shape))
        self._capturing.append(step)
        self.store.commit(step, wait=False)

    def wait_capture(self) -> None:
        """Returns once no checkpoint reads the training state any more."""
        while self._capturing:
            step = self._capturing[0]
            self.store.wait_capture(step)
            self._capturing.pop(0)

    def wait(self, step: Optional[int] = None) -> None:
        """Waits until `step` (default: the last saved) is committed."""
        self.wait_capture()
        if step is None:
            return
        self.store.wait_commit(step)

    def hook(self, optimizer) -> None:
        """Makes optimizer.step() wait for capture first, so that a checkpoint never sees the
        parameters and optimizer state half updated."""
        original = optimizer.step

        def step(*args, **kwargs):
            self.wait_capture()
            return original(*args, **kwargs)

        optimizer.step = step

    # -- loading --

    def latest(self) -> Optional[int]:
        """The newest step that can be loaded (for a job: on every rank), or None."""
        return self.store.latest()

    def load(self, step: Optional[int] = None, into: Any = None) -> Any:
        """Restores version `step` (default: the latest) and returns its state. Tensors found at
        the same place in `into` with the same dtype and shape are restored in place (so
        `into=model.state_dict()` loads the model's parameters); the rest are new tensors."""
        if step is None:
            step = self.latest()
            if step is None:
                raise LookupError(f"no checkpoint to load in {self.store!r}")
        listed = {t.name: t for t in self.store.list(step)}
        if _TREE not in listed:
            raise ValueError(f"version {step} was not saved by ckptdb.torch (no {_TREE})")
        record = bytearray(listed[_TREE].nbytes)
        self.store.restore(step, _TREE, record)
        doc = json.loads(record.decode("utf-8"))
        if doc.get("format") != _TREE_FORMAT:
            raise ValueError(f"version {step}: tree format {doc.get('format')!r}, this reads "
                             f"{_TREE_FORMAT}")
        return self._build(doc["tree"], into, step)

    # -- the tree --

    def _flatten(self, obj: Any, path: str, tensors: List[Tuple[str, torch.Tensor]]) -> Any:
        if isinstance(obj, torch.Tensor):
            if obj.dtype not in _TORCH_DTYPES:
                raise TypeError(f"{path or '/'}: tensors of {obj.dtype} are not supported")
            if obj.device.type != "cpu":
                raise ValueError(f"{path or '/'}: a tensor on {obj.device}; move it to the CPU")
            tensor = obj.detach()
            if not tensor.is_contiguous():
                tensor = tensor.contiguous()  # a copy, held by the store until captured
            name = path or "/"
            tensors.append((name, tensor))
            return {"t": name, "dtype": _TORCH_DTYPES[obj.dtype], "shape": list(obj.shape)}
        if isinstance(obj, dict):
            items = []
            for key, value in obj.items():
                if isinstance(key, bool) or not isinstance(key, (str, int)):
                    raise TypeError(f"{path or '/'}: a key of type {type(key).__name__}")
                kind = "s" if isinstance(key, str) else "i"
                items.append([kind, key, self._flatten(value, f"{path}/{_escape(str(key))}",
                                                       tensors)])
            return {"d": items}
        if isinstance(obj, (list, tuple)):
            kind = "l" if isinstance(obj, list) else "u"
            return {kind: [self._flatten(v, f"{path}/{i}", tensors) for i, v in enumerate(obj)]}
        if obj is None or isinstance(obj, (bool, str)):
            return {"v": obj}
        if isinstance(obj, int):
            return {"i": str(obj)}  # any size
        if isinstance(obj, float):
            return {"f": obj.hex()}  # bit for bit, NaN and infinities included
        if self.allow_pickle:
            return {"p": base64.b64encode(pickle.dumps(obj)).decode("ascii")}
        raise TypeError(f"{path or '/'}: a {type(obj).__name__} is not a tensor, dict, list, "
                        "tuple, int, float, bool, str or None (allow_pickle=True pickles it)")

    def _build(self, node: Any, into: Any, step: int) -> Any:
        if "t" in node:
            dtype = _FROM_NAME[node["dtype"]]
            shape = tuple(node["shape"])
            if (isinstance(into, torch.Tensor) and into.dtype == dtype and
                    tuple(into.shape) == shape and into.device.type == "cpu" and
                    into.is_contiguous()):
                out = into
            else:
                out = torch.empty(shape, dtype=dtype)
            with torch.no_grad():
                self.store.restore(step, node["t"], out)
            return out
        if "d" in node:
            result = {}
            for kind, key, child in node["d"]:
                sub = into.get(key) if isinstance(into, dict) else None
                result[key if kind == "s" else int(key)] = self._build(child, sub, step)
            return result
        if "l" in node or "u" in node:
            items = node.get("l", node.get("u"))
            subs = into if isinstance(into, (list, tuple)) and len(into) == len(items) else None
            built = [self._build(c, subs[i] if subs else None, step) for i, c in enumerate(items)]
            return built if "l" in node else tuple(built)
        if "v" in node:
            return node["v"]
        if "i" in node:
            return int(node["i"])
        if "f" in node:
            return float.fromhex(node["f"])
        if "p" in node:
            if not self.allow_pickle:
                raise ValueError(f"version {step} holds a pickled value; load it with a "
                                 "Checkpointer made with allow_pickle=True")
            return pickle.loads(base64.b64decode(node["p"]))
        raise ValueError(f"version {step}: an unknown node in its tree: {sorted(node)}")


__all__ = ["Checkpointer", "DTYPES"]
