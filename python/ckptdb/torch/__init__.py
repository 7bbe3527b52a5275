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

Resharding: a rank's piece of a tensor split across ranks is saved as a `Shard(tensor,
global_shape, offset)`. `load_sharded(into=..., saved=[the saved job's roots])` then loads
the state on another number of ranks, or another split: each tensor or Shard in `into` is
filled from the saved shards it meets (ckptdb_restore_slice, reading only the chunks it needs).
"""

import base64
import ctypes
import gc
import importlib.machinery
import importlib.util
import json
import os
import pickle
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from ckptdb import _capi
from ckptdb._capi import DTYPES, NotFound, Store
from ckptdb.aor import RecomputedOptimizer, optimizer_shards  # noqa: F401 - REFT's AOR

_TREE = "__ckptdb__/tree"
_TREE_FORMAT = 1

_TORCH_DTYPES = {
    torch.bool: "bool", torch.uint8: "u8", torch.int8: "i8", torch.int16: "i16",
    torch.int32: "i32", torch.int64: "i64", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.float32: "f32", torch.float64: "f64",
}
_FROM_NAME = {name: dtype for dtype, name in _TORCH_DTYPES.items()}
_CODE_OF = {name: DTYPES[name] for name in _TORCH_DTYPES.values()}


def _load_native():
    """ckptdb._native (python/native/walk.cc), the save's walk in native code: installed in this
    package, else built beside the library (build/_native.*.so). None without it, or with
    CKPTDB_NATIVE=0: save() then walks the state in Python, several times slower a tensor."""
    if os.environ.get("CKPTDB_NATIVE") == "0":
        return None
    try:
        from ckptdb import _native as module  # noqa: PLC0415 - optional
    except ImportError:
        module = None
        directory = os.path.dirname(_capi.library_path())
        for suffix in importlib.machinery.EXTENSION_SUFFIXES if directory else ():
            path = os.path.join(directory, "_native" + suffix)
            if os.path.exists(path):
                spec = importlib.util.spec_from_file_location("ckptdb._native", path)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                break
    if module is None:
        return None
    if (module.SHARD_SIZE, module.INFO_SIZE) != (ctypes.sizeof(_capi._Shard),
                                                 ctypes.sizeof(_capi._TensorInfo)):
        raise ImportError(f"{module.__file__} was built for other ckptdb structures "
                          f"({module.SHARD_SIZE}, {module.INFO_SIZE}) than this package's: "
                          "rebuild it, or set CKPTDB_NATIVE=0")
    return module


_native = _load_native()
NATIVE = _native is not None  # whether save() walks the state in native code


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


class Shard:
    """A rank's piece of a global tensor: `tensor` holds the elements [offset, offset +
    tensor.shape) of a tensor of `global_shape` (one offset per dimension). Saved, it records its
    place; given to load_sharded, it says which piece to load."""

    def __init__(self, tensor: torch.Tensor, global_shape: Sequence[int], offset: Sequence[int]):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"Shard of a {type(tensor).__name__}: it holds a torch.Tensor")
        self.tensor = tensor
        self.global_shape = tuple(int(d) for d in global_shape)
        self.offset = tuple(int(d) for d in offset)
        shape = tuple(tensor.shape)
        if len(self.global_shape) != len(shape) or len(self.offset) != len(shape):
            raise ValueError(f"Shard of shape {shape}: global_shape {self.global_shape} and "
                             f"offset {self.offset} need one entry per dimension")
        for d, (o, n, g) in enumerate(zip(self.offset, shape, self.global_shape)):
            if o < 0 or o + n > g:
                raise ValueError(f"Shard of shape {shape} at offset {self.offset}: dimension {d} "
                                 f"runs past the global shape {self.global_shape}")

    def __repr__(self) -> str:
        return (f"Shard(shape={tuple(self.tensor.shape)}, global_shape={self.global_shape}, "
                f"offset={self.offset}, dtype={self.tensor.dtype})")


_PUT_BATCH = 1024  # tensors a ckptdb_put_shards call of the native walk: packs fill, capture starts


def _synchronize(device) -> None:
    """ckptdb's copies of CUDA memory are not ordered after the device's current stream."""
    torch.cuda.current_stream(device).synchronize()


if _native is not None:
    _native.configure(torch.Tensor, Shard,
                      {dtype: (name, _CODE_OF[name], torch.empty(0, dtype=dtype).element_size())
                       for dtype, name in _TORCH_DTYPES.items()},
                      _TREE, _TREE_FORMAT, torch.__version__)


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
        # The tree, the record and the descriptors make a few objects a tensor and none that
        # cycle: the cyclic collector, triggered by so many allocations, would only rescan the
        # whole heap several times per save (a third of a save of 50,000 tensors).
        collecting = gc.isenabled()
        gc.disable()
        try:
            self._save(step, state)
        finally:
            if collecting:
                gc.enable()

    def _save(self, step: int, state: Any) -> None:
        if _native is not None:
            # The walk, the tree record and the descriptors in one native pass (the same
            # record as the Python walk below writes; what it does not know, _leaf says), put
            # _PUT_BATCH tensors at a time as it goes, so that capture copies the first while
            # the rest are walked; the record last. A walk that fails after a put aborts the
            # version itself: nothing of a refused save stays.
            with self.store._holding() as db:  # the handle stays open for the walk's puts
                sink = self.store._sink(db, step, _PUT_BATCH, _synchronize)
                status, keep = _native.walk(state, self.rank, self.world_size, self._leaf, sink)
            self.store._pin(step, keep)
            if status != 0:
                try:
                    _capi._check(status)
                finally:
                    # Even a first put that failed may have queued its lazy shards (a capture
                    # error of its COPY_NOW record): the version goes, and its pins with it.
                    self._abort_quietly(step)
        else:
            try:
                self._save_walked_in_python(step, state)
            except _capi.Error:
                self._abort_quietly(step)
                raise
        self._capturing.append(step)
        self.store.commit(step, wait=False)

    def _abort_quietly(self, step: int) -> None:
        """A refused save's version aborted, its pins released; the refusal is the error."""
        try:
            self.store.abort(step)
        except _capi.Error:
            pass

    def _leaf(self, obj: Any, path: str) -> str:
        """The JSON text of a leaf the native walk does not know: pickled, or refused."""
        tensors: list = []
        node = self._flatten(obj, path, tensors)
        if tensors:  # it passes for a container or tensor in Python, not in C
            raise TypeError(f"{path or '/'}: a {type(obj).__name__} holding tensors that the "
                            "native walk cannot read (CKPTDB_NATIVE=0 walks it in Python)")
        return json.dumps(node, separators=(",", ":"), allow_nan=False)

    def _save_walked_in_python(self, step: int, state: Any) -> None:
        items = self._walk_in_python(state)
        for device in {item[3].device for item in items[1:] if item[8] & _capi.PUT_DEVICE}:
            _synchronize(device)
        self.store._put_many(step, items)

    def _walk_in_python(self, state: Any) -> List[tuple]:
        """The items of Store._put_many for `state`, the tree record first: the walk where
        ckptdb._native is not built (and the reference its tests compare it with)."""
        tensors: List[Tuple[str, torch.Tensor, Optional[Shard], int]] = []
        tree = self._flatten(state, "", tensors)
        record = json.dumps({"format": _TREE_FORMAT, "rank": self.rank,
                             "world_size": self.world_size, "tree": tree},
                            separators=(",", ":"), allow_nan=False).encode("utf-8")
        # One ckptdb_put_shards call for the tree record and every tensor, described with as
        # little Python per tensor as possible (the tree already checked dtype and device).
        items = [(_TREE.encode(), *_capi.buffer_address(record), None, None, None, None,
                  _capi.PUT_COPY_NOW)]
        names = [name.encode("utf-8") for name, _, _, _ in tensors]
        if any(b"\0" in n for n in names):
            bad = next(name for name, _, _, _ in tensors if "\0" in name)
            raise ValueError(f"name {bad!r} contains a NUL byte")
        for name, (_, tensor, shard, code) in zip(names, tensors):
            items.append((name, tensor.data_ptr(), tensor.numel() * tensor.element_size(), tensor,
                          code, tensor.shape,
                          shard.global_shape if shard else None, shard.offset if shard else None,
                          _capi.PUT_DEVICE if tensor.is_cuda else 0))
        return items

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
        return self._build(_read_tree(self.store, step)["tree"], into, step)

    def load_sharded(self, into: Any, step: Optional[int] = None,
                     saved: Optional[Sequence[str]] = None) -> Any:
        """Loads `into` from the checkpoint of a job that may have had another number of ranks
        or split its tensors otherwise: `saved` lists that job's roots, one per rank (default:
        this store alone, which holds only this rank's shards: each box must lie in them). See
        load_sharded()."""
        if saved is None:
            return _load_sharded([self.store], into, step, self.allow_pickle, [repr(self.store)],
                                 whole_job=False)
        return load_sharded(saved, into, step, allow_pickle=self.allow_pickle)

    # -- the tree --

    def _flatten(self, obj: Any, path: str,
                 tensors: List[Tuple[str, torch.Tensor, Optional[Shard]]]) -> Any:
        # Tensors first: a state dict is mostly tensors, and this runs once for each.
        if isinstance(obj, torch.Tensor):
            dtype = _TORCH_DTYPES.get(obj.dtype)
            if dtype is None:
                raise TypeError(f"{path or '/'}: tensors of {obj.dtype} are not supported")
            if not (obj.is_cpu or obj.is_cuda):  # (obj.device makes an object: 6x slower)
                raise ValueError(f"{path or '/'}: a tensor on {obj.device}; move it to the CPU")
            # Its memory is read by address, never through autograd: a contiguous tensor is
            # held as it is (detach() would make a new tensor object for nothing). A negative
            # view's memory holds the values before the negation: resolved into a copy first.
            tensor = obj.resolve_neg() if obj.is_neg() else obj
            if not tensor.is_contiguous():
                tensor = tensor.detach().contiguous()  # a held copy
            name = path or "/"
            tensors.append((name, tensor, None, _CODE_OF[dtype]))
            # torch.Size is a tuple: JSON writes it as the list it is.
            return {"t": name, "dtype": dtype, "shape": obj.shape}
        if isinstance(obj, Shard):
            node = self._flatten(obj.tensor, path, tensors)
            tensors[-1] = (tensors[-1][0], tensors[-1][1], obj, tensors[-1][3])
            node["g"] = list(obj.global_shape)
            node["o"] = list(obj.offset)
            return node
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
        if "t" in node and "g" in node:
            inner = self._build({k: v for k, v in node.items() if k not in ("g", "o")},
                                into.tensor if isinstance(into, Shard) else None, step)
            return Shard(inner, node["g"], node["o"])
        if "t" in node:
            dtype = _FROM_NAME[node["dtype"]]
            shape = tuple(node["shape"])
            if (isinstance(into, torch.Tensor) and into.dtype == dtype and
                    tuple(into.shape) == shape and into.device.type in ("cpu", "cuda") and
                    into.is_contiguous() and not into.is_neg()):
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
        return _plain(node, self.allow_pickle, step)


def _plain(node: Any, allow_pickle: bool, step: int) -> Any:
    """A leaf of a saved tree that is not a tensor."""
    if "v" in node:
        return node["v"]
    if "i" in node:
        return int(node["i"])
    if "f" in node:
        return float.fromhex(node["f"])
    if "p" in node:
        if not allow_pickle:
            raise ValueError(f"version {step} holds a pickled value; load it with a "
                             "Checkpointer made with allow_pickle=True")
        return pickle.loads(base64.b64decode(node["p"]))
    raise ValueError(f"version {step}: an unknown node in its tree: {sorted(node)}")


def _read_tree(store: Store, step: int) -> Dict[str, Any]:
    listed = {t.name: t for t in store.list(step)}
    if _TREE not in listed:
        raise ValueError(f"version {step} of {store!r} was not saved by ckptdb.torch (no {_TREE})")
    record = bytearray(listed[_TREE].nbytes)
    store.restore(step, _TREE, record)
    doc = json.loads(record.decode("utf-8"))
    if doc.get("format") != _TREE_FORMAT:
        raise ValueError(f"version {step} of {store!r}: tree format {doc.get('format')!r}, this "
                         f"reads {_TREE_FORMAT}")
    return doc


def _leaves(node: Any, path: str, out: Dict[str, Any]) -> Dict[str, Any]:
    """Every leaf of a saved tree by the path save() gave it."""
    if "d" in node:
        for _kind, key, child in node["d"]:
            _leaves(child, f"{path}/{_escape(str(key))}", out)
    elif "l" in node or "u" in node:
        for i, child in enumerate(node.get("l", node.get("u"))):
            _leaves(child, f"{path}/{i}", out)
    else:
        out[path or "/"] = node
    return out


def _box_of(node: Dict[str, Any]) -> Tuple[Tuple[int, ...], Tuple[int, ...], Tuple[int, ...]]:
    """(global shape, offset, shape) of a saved tensor node; a whole tensor is its own shard."""
    shape = tuple(node["shape"])
    if "g" in node:
        return tuple(node["g"]), tuple(node["o"]), shape
    return shape, (0,) * len(shape), shape


def _meets(a_off, a_shape, b_off, b_shape) -> bool:
    return all(ao < bo + bn and bo < ao + an
               for ao, an, bo, bn in zip(a_off, a_shape, b_off, b_shape))


# The most ranks load_sharded looks for in tier directories read alone (a job's world size bound).
_MAX_VIEW_RANKS = 65536


def load_sharded(saved: Optional[Sequence[str]], into: Any, step: Optional[int] = None, *,
                 allow_pickle: bool = False, tiers: Optional[str] = None) -> Any:
    """Loads `into` from a checkpoint saved by a job of any number of ranks, whatever its split.

    `saved` lists the saved job's roots (every rank's, in any order; each is opened read-only,
    with the tiers its catalog recorded, or `tiers`, or CKPTDB_TIERS when set). With `saved`
    None or empty, `tiers` alone is read: the saved job's tier directories (its nfs tier, after
    the job, its nodes and their catalogs are gone; docs/python.md), every rank that committed
    there, found from rank 0 up. `step` defaults
    to the newest version committed in all of them. `into` is the state as this rank wants it:
    each `Shard(t, global_shape, offset)` in it is filled with that box of the global tensor,
    each plain tensor with the whole tensor, from the saved shards at the same place (reading
    only the chunks the box lies in); other leaves take the saved rank 0's value. Returns `into`'s
    structure with those values (tensors filled in place). Raises ValueError when the saved
    roots are not one whole job, or a box's dtype, global shape or coverage does not match.
    """
    stores = []
    names = list(saved or [])
    try:
        for root in names:
            stores.append(Store(root, tiers=tiers, rank=0, world_size=1, read_only=True))
        if not names:
            if not tiers:
                raise ValueError("load_sharded: give the saved roots, or tiers to read alone")
            for rank in range(_MAX_VIEW_RANKS):
                try:
                    stores.append(Store(None, tiers=tiers, rank=rank, read_only=True))
                except NotFound:
                    if rank == 0:
                        raise
                    break
                names.append(f"tiers {tiers} (rank {rank})")
        return _load_sharded(stores, into, step, allow_pickle, names)
    finally:
        for store in stores:
            store.close()


def _load_sharded(stores: List[Store], into: Any, step: Optional[int], allow_pickle: bool,
                  names: List[str], whole_job: bool = True) -> Any:
    if not stores:
        raise ValueError("load_sharded: no saved root given")
    if step is None:
        latest = [s.latest() for s in stores]
        if any(v is None for v in latest):
            raise LookupError("load_sharded: nothing committed in " +
                              ", ".join(n for n, v in zip(names, latest) if v is None))
        step = min(latest)
    docs = [_read_tree(s, step) for s in stores]
    world = docs[0].get("world_size", 1)
    ranks: Dict[int, str] = {}
    # Trees saved before ranks were recorded in them cannot be checked for a whole job; each
    # box's coverage still is.
    whole_job = whole_job and all("rank" in d and "world_size" in d for d in docs)
    for name, doc in zip(names, docs if whole_job else []):
        rank = doc.get("rank", 0)
        if doc.get("world_size", 1) != world:
            raise ValueError(f"load_sharded: {names[0]} holds a rank of a job of {world}, {name} "
                             f"one of {doc.get('world_size', 1)}")
        if rank in ranks:
            raise ValueError(f"load_sharded: {name} and {ranks[rank]} both hold rank {rank}")
        ranks[rank] = name
    if whole_job and len(ranks) != world:
        missing = sorted(set(range(world)) - set(ranks))
        raise ValueError(f"load_sharded: version {step} was saved by a job of {world} ranks; the "
                         f"roots given hold ranks {sorted(ranks)}, not {missing}")
    order = sorted(range(len(stores)), key=lambda i: docs[i].get("rank", i))
    stores = [stores[i] for i in order]
    leaves = [_leaves(docs[i]["tree"], "", {}) for i in order]

    # First every box is planned and checked, then read: a target that does not match the save
    # raises before any tensor of `into` is written.
    reads: List[Tuple[str, torch.Tensor, Tuple[int, ...], List[Store]]] = []

    def plan(path: str, target: torch.Tensor, global_shape, offset) -> None:
        box_shape = tuple(target.shape)
        sources: List[Tuple[Store, Tuple[int, ...], Tuple[int, ...]]] = []
        found = False
        for store, saved in zip(stores, leaves):
            node = saved.get(path)
            if node is None or "t" not in node:
                continue
            found = True
            g, o, n = _box_of(node)
            if g != tuple(global_shape):
                raise ValueError(f"load_sharded {path}: saved with global shape {g}, wanted "
                                 f"{tuple(global_shape)}")
            if _FROM_NAME[node["dtype"]] != target.dtype:
                raise ValueError(f"load_sharded {path}: saved as {node['dtype']}, the target "
                                 f"is {target.dtype}")
            if not _meets(o, n, offset, box_shape) or (o, n) in [x[1:] for x in sources]:
                continue  # misses the box, or a replica of a shard already used
            for _other, oo, on in sources:
                if _meets(o, n, oo, on):
                    raise ValueError(f"load_sharded {path}: saved shards at {o} and {oo} overlap")
            sources.append((store, o, n))
        if not found:
            raise KeyError(f"load_sharded: version {step} has no tensor at {path}")
        if not target.is_contiguous() or target.device.type != "cpu" or target.is_neg():
            raise ValueError(f"load_sharded {path}: the target must be a contiguous CPU tensor "
                             "(not a negative view)")
        covered = 0  # the sources are disjoint: their parts of the box add up
        for _store, o, n in sources:
            part = 1
            for oo, nn, bo, bn in zip(o, n, offset, box_shape):
                part *= min(oo + nn, bo + bn) - max(oo, bo)
            covered += part
        if covered != target.numel():
            raise ValueError(f"load_sharded {path}: the saved shards hold {covered} of the "
                             f"{target.numel()} elements of box {tuple(offset)} + {box_shape}")
        reads.append((path, target, tuple(offset), [x[0] for x in sources]))

    def walk(obj: Any, path: str) -> Any:
        if isinstance(obj, Shard):
            plan(path or "/", obj.tensor, obj.global_shape, obj.offset)
            return obj
        if isinstance(obj, torch.Tensor):
            plan(path or "/", obj, tuple(obj.shape), (0,) * obj.dim())
            return obj
        if isinstance(obj, dict):
            return {k: walk(v, f"{path}/{_escape(str(k))}") for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            built = [walk(v, f"{path}/{i}") for i, v in enumerate(obj)]
            return built if isinstance(obj, list) else tuple(built)
        node = leaves[0].get(path or "/")
        if node is None:
            raise KeyError(f"load_sharded: version {step} has no value at {path or '/'}")
        if "t" in node:
            raise ValueError(f"load_sharded {path or '/'}: saved as a tensor; give a tensor or a "
                             "Shard to load it into")
        return _plain(node, allow_pickle, step)

    result = walk(into, "")
    with torch.no_grad():
        for path, target, offset, sources in reads:
            covered = sum(store.restore_slice(step, path, offset, tuple(target.shape), target)
                          for store in sources)
            if covered != target.numel():  # the manifests disagree with the trees
                raise ValueError(f"load_sharded {path}: the saved shards held {covered} of the "
                                 f"{target.numel()} elements the trees promised")
    return result


__all__ = ["Checkpointer", "DTYPES", "Shard", "load_sharded"]

try:  # DCP's storage plugins (ckptdb.torch.dcp), where this torch has torch.distributed
    from ckptdb.torch import dcp  # noqa: E402,F401
except ImportError:  # pragma: no cover - a torch built without distributed
    dcp = None
