"""PyTorch distributed checkpointing (DCP) into ckptdb: `StorageWriter` and `StorageReader`
plugins, so that DCP's own save and load calls write into and read from ckptdb stores, with
ckptdb's lazy capture, atomic commit, replicas and tiers (docs/python.md, "DCP").

    from ckptdb.torch.dcp import dcp                          # DCP itself (import_dcp)
    store = ckptdb.Store(root, tiers="ram:8G,keep=2;disk:/nvme/ck,every=10")
    writer = ckptdb.torch.dcp.StorageWriter(store, version=step)
    dcp.save_state_dict(state_dict, writer)                   # returns once capture is done
    ...
    reader = ckptdb.torch.dcp.StorageReader(saved_stores, version=step)
    dcp.load_state_dict(state_dict, reader)                   # resharded when it differs

One DCP checkpoint is one ckptdb version. Each rank writes the items DCP plans for it into its
own store (its segment of the version): a tensor item as tensor "dcp/<fqn>@<offsets>" with its
chunk's place in the global tensor (global_shape, global_offset), a byte item as "dcp/<fqn>", and
"dcp/.rank" (the writing rank, so that a reader can check the stores it is given). The
coordinator also writes "dcp/.metadata", DCP's Metadata pickled (as DCP's FileSystemWriter writes
its `.metadata` file: a reader trusts the store as it would trust that file).

**When the caller may change its tensors again.** DCP has no call between its save and the
caller's next change of the tensors. By default (`wait_capture=True`) the writer's write_data
waits until capture has copied every tensor out of the caller's memory (into ckptdb's staging
and ram tier, at memory speed) before DCP's save returns: after it, the tensors are the caller's
again, while the commit, replication and demotion to slower tiers go on in the background. With
`wait_capture=False` the save returns as soon as every tensor is handed over; the caller must
then call `writer.wait_capture()` before it changes any of them (before the next optimizer
step), as with ckptdb's own loop: the forward and backward passes overlap the copy.
`writer.wait_commit()` waits until the version is committed.

Which methods each torch calls (the classes implement both):
  - torch 1.13 (`torch.distributed._shard.checkpoint`): writer init(is_coordinator),
    prepare_local_plan, prepare_global_plan (coordinator), write_data, finish (coordinator);
    reader read_metadata, init(metadata, is_coordinator), prepare_local_plan,
    prepare_global_plan (coordinator), read_data.
  - torch 2.x (`torch.distributed.checkpoint`): writer reset(checkpoint_id),
    set_up_storage_writer(is_coordinator), then the same; reader reset(checkpoint_id),
    read_metadata, set_up_storage_reader(metadata, is_coordinator), then the same;
    validate_checkpoint_id (a version number) and storage_meta on both.

The version: the one given, or the coordinator's choice (above its store's latest and above the
last version a writer of this process opened there, whose commit may still be running), sent to
every rank in its save plan. Each rank's commit is asynchronous: a non-coordinator commits at the
end of write_data, the coordinator in finish once "dcp/.metadata" is put. In a ckptdb job
(world_size > 1) the version commits on every rank at once or on none (the two-phase commit);
with one store per rank and no job, each rank's store commits on its own. A rank whose
write_data fails aborts its version; when another rank failed, torch calls no finish and a
rank's version stays open until its next save aborts it (or writer.abort()).
"""

import dataclasses
import importlib
import io
import pickle
import sys
import weakref
from typing import List, Optional, Sequence, Union

import torch
import torch.distributed as dist
from torch.futures import Future

from ckptdb import _capi
from ckptdb._capi import NotFound, Store


def import_dcp():
    """PyTorch's DCP package: torch.distributed.checkpoint (torch 2.x), else
    torch.distributed._shard.checkpoint (torch 1.13). Debian's torch 1.13 does not import the
    latter under Python 3.11 (a dataclass, TensorProperties, with an unhashable default, which
    3.11 refuses); it is then imported with that one class made hashable (unsafe_hash), which
    changes nothing it does. Use the module this returns (or import DCP after it)."""
    try:
        module = importlib.import_module("torch.distributed.checkpoint")
        if hasattr(module, "StorageWriter"):
            return module
    except ImportError:
        pass
    name = "torch.distributed._shard.checkpoint"
    try:
        return importlib.import_module(name)
    except ValueError as e:
        if "mutable default" not in str(e):
            raise
    for loaded in [m for m in sys.modules if m.startswith("torch.distributed._shard")]:
        del sys.modules[loaded]  # what the failed import left half made
    original = dataclasses.dataclass

    def patched(cls=None, /, **kw):
        def wrap(c):
            if c.__name__ == "TensorProperties":
                return original(**dict(kw, unsafe_hash=True))(c)
            return original(**kw)(c)
        return wrap if cls is None else wrap(cls)

    dataclasses.dataclass = patched
    try:
        return importlib.import_module(name)
    finally:
        dataclasses.dataclass = original


dcp = import_dcp()
_planner = importlib.import_module(dcp.__name__ + ".planner")
_storage = importlib.import_module(dcp.__name__ + ".storage")
_Reader, _Writer = dcp.StorageReader, dcp.StorageWriter
LoadItemType, WriteItemType = _planner.LoadItemType, _planner.WriteItemType
WriteResult = _storage.WriteResult

PREFIX = "dcp/"
METADATA = PREFIX + ".metadata"
RANK = PREFIX + ".rank"


@dataclasses.dataclass(frozen=True)
class Stored:
    """Where one DCP item is (Metadata.storage_data's values): the saving rank, whose store
    holds it, the tensor's name there, its chunk's shape (None for bytes) and its bytes."""

    rank: int
    name: str
    shape: Optional[tuple]
    nbytes: int
    dtype: Optional[str] = None  # the saved tensor's ("torch.float16"); a load converts from it


@dataclasses.dataclass(frozen=True)
class _Plan:
    """SavePlan.storage_data: the version the coordinator chose for every rank's save."""

    version: int


@dataclasses.dataclass
class _Opened:
    version: int
    committed: bool = False


# Per store, the version this process's last StorageWriter opened on it and whether it committed
# it: the next save's version is above it even while its commit is still running, and a version
# DCP abandoned (another rank failed: DCP then calls no finish) is aborted by the next save.
_OPENED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _torch_dtype(text: Optional[str]):
    if not text or not text.startswith("torch."):
        return None
    dtype = getattr(torch, text[len("torch."):], None)
    return dtype if isinstance(dtype, torch.dtype) else None


def _item_name(index) -> str:
    if index.offset is None:
        return PREFIX + index.fqn
    return PREFIX + index.fqn + "@" + ",".join(str(int(o)) for o in index.offset)


def _checked_version(checkpoint_id, what: str) -> int:
    return _capi._version(checkpoint_id, what)


def _this_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


class StorageWriter(_Writer):
    """Writes DCP's save into `store` as `version` (None: the coordinator's choice, above its
    store's latest and above the last version a writer of this process opened on it, sent to
    every rank in its plan). `rank`: the saving rank recorded with each item (default:
    torch.distributed's global rank, 0 without a process group: give it for a subgroup); a
    reader is given the stores in that order."""

    def __init__(self, store: Store, version: Optional[int] = None, *,
                 wait_capture: bool = True, rank: Optional[int] = None):
        super().__init__()
        if not isinstance(store, Store):
            raise TypeError(f"StorageWriter: store must be a ckptdb.Store, not "
                            f"{type(store).__name__}")
        self.store = store
        self._asked = None if version is None else _checked_version(version, "StorageWriter")
        self._wait = wait_capture
        self._rank = rank
        self.version: Optional[int] = None  # the version of the save in progress or done
        self._coordinator = False

    # -- torch 2.x -------------------------------------------------------------------------------
    def reset(self, checkpoint_id=None) -> None:
        if checkpoint_id is not None:
            self._asked = _checked_version(checkpoint_id, "StorageWriter.reset")
        self.version = None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        try:
            _checked_version(checkpoint_id, "StorageWriter")
            return True
        except (TypeError, ValueError):
            return False

    def set_up_storage_writer(self, is_coordinator: bool, *args, **kwargs) -> None:
        self.init(is_coordinator)

    def storage_meta(self):
        return None

    # -- both ------------------------------------------------------------------------------------
    def init(self, is_coordinator: bool) -> None:
        self._coordinator = bool(is_coordinator)
        self.version = None
        if self._rank is None:
            self._rank = _this_rank()
        opened = _OPENED.get(self.store)
        if opened is not None and not opened.committed:
            try:  # a save DCP abandoned on this rank (another rank's failed): never committed
                self.store.abort(opened.version)
            except _capi.Error:
                pass
            opened.committed = True  # settled

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        """Coordinator only: one version for every rank's save, sent in each plan (ranks that
        asked their own store's latest could differ, or take a version still being
        committed)."""
        if self._asked is not None:
            version = self._asked
        else:
            latest = self.store.latest()
            opened = _OPENED.get(self.store)
            version = max(-1 if latest is None else latest,
                          -1 if opened is None else opened.version) + 1
            version = _checked_version(version, "StorageWriter")
        return [dataclasses.replace(p, storage_data=_Plan(version)) for p in plans]

    def write_data(self, plan, planner) -> Future:
        planned = plan.storage_data
        if not isinstance(planned, _Plan):
            raise _capi.StateError(-4, "StorageWriter.write_data: the plan carries no version "
                                       "(prepare_global_plan was not this writer's)")
        version = self.version = planned.version
        _OPENED[self.store] = _Opened(version)
        results: List[WriteResult] = []
        try:
            marker = int(self._rank).to_bytes(8, "little")
            self.store.put_shard(version, RANK, marker, copy_now=True)
            for item in plan.items:
                name = _item_name(item.index)
                data = planner.resolve_data(item)
                if item.type == WriteItemType.BYTE_IO:
                    blob = data.getvalue() if isinstance(data, io.BytesIO) else bytes(data)
                    self.store.put_shard(version, name, blob, copy_now=True)
                    results.append(WriteResult(index=item.index, size_in_bytes=len(blob),
                                               storage_data=Stored(self._rank, name, None,
                                                                   len(blob))))
                    continue
                tensor = data.detach()
                if tensor.device.type != "cpu":
                    tensor = tensor.cpu()
                if not tensor.is_contiguous():
                    tensor = tensor.contiguous()  # a copy, which the store keeps until captured
                chunk = item.tensor_data.chunk
                whole = tuple(item.tensor_data.size)
                placed = tensor.dim() > 0
                self.store.put_shard(
                    version, name, tensor,
                    global_shape=whole if placed else None,
                    global_offset=tuple(int(o) for o in chunk.offsets) if placed else None)
                nbytes = tensor.numel() * tensor.element_size()
                results.append(WriteResult(index=item.index, size_in_bytes=nbytes,
                                           storage_data=Stored(self._rank, name,
                                                               tuple(tensor.shape), nbytes,
                                                               str(tensor.dtype))))
            if self._wait:
                self.store.wait_capture(version)
            if not self._coordinator:
                self.store.commit(version, wait=False)
                _OPENED[self.store].committed = True
        except BaseException:
            self._drop()
            raise
        future: Future = Future()
        future.set_result(results)
        return future

    def finish(self, metadata, results) -> None:
        """Coordinator only (both torches): Metadata with where every item is, put as
        "dcp/.metadata", then this rank's commit (asynchronous)."""
        version = self.version
        metadata.storage_data = {r.index: r.storage_data for rs in results for r in rs}
        try:
            self.store.put_shard(version, METADATA, pickle.dumps(metadata), copy_now=True)
            self.store.commit(version, wait=False)
            _OPENED[self.store].committed = True
        except BaseException:
            self._drop()
            raise

    def _drop(self) -> None:
        """Nothing half saved: the version is dropped on this rank (and so, in a job, it never
        commits anywhere). The failure that led here is what the caller hears."""
        try:
            self.store.abort(self.version)
        except _capi.Error:
            pass
        if self.store in _OPENED:
            _OPENED[self.store].committed = True  # settled

    def abort(self) -> None:
        """Drops the last save's version on this rank if it is not committed (a rank whose save
        DCP abandoned because another rank failed; the next save does it too)."""
        opened = _OPENED.get(self.store)
        if opened is not None and not opened.committed and opened.version == self.version:
            self._drop()

    # -- ckptdb's own ----------------------------------------------------------------------------
    def wait_capture(self) -> None:
        """With wait_capture=False: returns once the last save no longer reads the caller's
        tensors (call it before changing any of them)."""
        if self.version is not None:
            self.store.wait_capture(self.version)

    def wait_commit(self, timeout_ms: int = -1) -> None:
        """Returns once the last save's version is committed (this rank's, and in a job every
        rank's)."""
        if self.version is None:
            raise _capi.StateError(-4, "StorageWriter.wait_commit: nothing was saved")
        self.store.wait_commit(self.version, timeout_ms=timeout_ms)


class StorageReader(_Reader):
    """Reads a DCP checkpoint that StorageWriter saved as `version` (None: the newest version
    of stores[0], which each rank asks for itself: give the version in a job of several). `stores`: the saving job's stores, one per saving rank in rank order (one
    Store alone for a job of one rank); in a job of another size they are opened read-only
    (`ckptdb.Store(root, read_only=True)`, docs/python.md), and each ReadItem is read with
    restore_slice from the store of the rank that saved it: only the chunks it needs."""

    def __init__(self, stores: Union[Store, Sequence[Store]], version: Optional[int] = None):
        super().__init__()
        self._stores = [stores] if isinstance(stores, Store) else list(stores)
        if not self._stores or not all(isinstance(s, Store) for s in self._stores):
            raise TypeError("StorageReader: stores must be a ckptdb.Store or a list of them")
        self._asked = None if version is None else _checked_version(version, "StorageReader")
        self.version: Optional[int] = None
        self._places = {}

    def reset(self, checkpoint_id=None) -> None:
        if checkpoint_id is not None:
            self._asked = _checked_version(checkpoint_id, "StorageReader.reset")
        self.version = None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return StorageWriter.validate_checkpoint_id(checkpoint_id)

    def set_up_storage_reader(self, metadata, is_coordinator: bool, *args, **kwargs) -> None:
        self.init(metadata, is_coordinator)

    def _read_bytes(self, store: Store, name: str, nbytes: int) -> bytearray:
        out = bytearray(nbytes)
        store.restore(self.version, name, out)
        return out

    def read_metadata(self):
        if self._asked is not None:
            self.version = self._asked
        else:
            latest = self._stores[0].latest()
            if latest is None:
                raise NotFound(-2, "StorageReader: the first store has no restorable version")
            self.version = latest
        sizes = {}
        for rank, store in enumerate(self._stores):
            listed = {t.name: t.nbytes for t in store.list(self.version)}
            if RANK not in listed:
                raise NotFound(-2, f"StorageReader: store {rank} has no DCP save in version "
                                   f"{self.version} (no {RANK!r})")
            saved = int.from_bytes(self._read_bytes(store, RANK, listed[RANK]), "little")
            if saved != rank:
                raise _capi.InvalidError(-1, f"StorageReader: store {rank} holds rank {saved}'s "
                                             "save: give the stores in the saving ranks' order")
            if METADATA in listed:
                sizes[rank] = listed[METADATA]
        if not sizes:
            raise NotFound(-2, f"StorageReader: no store holds {METADATA!r} of version "
                               f"{self.version} (the coordinator's save did not finish)")
        rank = min(sizes)
        return pickle.loads(bytes(self._read_bytes(self._stores[rank], METADATA, sizes[rank])))

    def init(self, metadata, is_coordinator: bool) -> None:
        self._places = metadata.storage_data or {}

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def _where(self, index) -> Stored:
        stored = self._places.get(index)
        if stored is None:
            raise NotFound(-2, f"StorageReader: version {self.version} has no item {index}")
        if not 0 <= stored.rank < len(self._stores):
            raise NotFound(-2, f"StorageReader: {stored.name!r} was saved by rank {stored.rank}, "
                               f"and only {len(self._stores)} store(s) were given")
        return stored

    def read_data(self, plan, planner) -> Future:
        for req in plan.items:
            stored = self._where(req.storage_index)
            store = self._stores[stored.rank]
            if req.type == LoadItemType.BYTE_IO:
                blob = self._read_bytes(store, stored.name, stored.nbytes)
                planner.load_bytes(req, io.BytesIO(bytes(blob)))
                continue
            target = planner.resolve_tensor(req).detach()
            lengths = tuple(int(n) for n in req.lengths)
            starts = tuple(int(o) for o in req.storage_offsets)
            saved = _torch_dtype(stored.dtype) or target.dtype
            # Restored as saved; copied (converted) when the target differs in place or dtype.
            direct = (target.device.type == "cpu" and target.is_contiguous() and
                      target.dtype == saved)
            out = target if direct else torch.empty(lengths, dtype=saved)
            if stored.shape == lengths and not any(starts):
                store.restore(self.version, stored.name, out)  # the whole chunk
            else:
                chunk = req.storage_index.offset or (0,) * len(lengths)
                offset = tuple(int(c) + s for c, s in zip(chunk, starts))
                covered = store.restore_slice(self.version, stored.name, offset, lengths, out)
                if covered != out.numel():
                    raise _capi.CorruptError(-5, f"StorageReader: {stored.name!r} covers "
                                                 f"{covered} of the {out.numel()} elements asked")
            if not direct:
                target.copy_(out)
            planner.commit_tensor(req, target)
        future: Future = Future()
        future.set_result(None)
        return future
