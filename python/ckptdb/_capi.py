"""The ctypes layer over libckptdb.so: the C structures, the functions' signatures, errors, and
the Store class. Kept in one place so that a change to include/ckptdb/ckptdb.h has one Python
counterpart to follow (python/tests checks every mirrored structure's offsets against what the C
compiler makes of the header)."""

import contextlib
import ctypes
import numbers
import ctypes.util
import itertools
import os
import struct
import threading
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

ALL_VERSIONS = (1 << 64) - 1
_MAX_DIMS = 8
_UNSET = 0xFFFFFFFF

# ckptdb_dtype, by the names ckptdb_dtype_name gives them ("raw": bytes, no element type).
DTYPES = {
    "raw": 0,
    "bool": 1,
    "u8": 2,
    "i8": 3,
    "u16": 4,
    "i16": 5,
    "u32": 6,
    "i32": 7,
    "u64": 8,
    "i64": 9,
    "f16": 10,
    "bf16": 11,
    "f32": 12,
    "f64": 13,
    "f8_e4m3": 14,
    "f8_e5m2": 15,
}

_PUT_COPY_NOW = 0x1
_PUT_DEVICE = 0x2
_PUT_REPLICATED = 0x4
_PUT_RECOMPUTED = 0x8
PUT_COPY_NOW = _PUT_COPY_NOW  # for ckptdb.torch's batched put (Store._put_many)
PUT_DEVICE = _PUT_DEVICE
_RESTORE_DEVICE = 0x1
_COMMIT_ASYNC = 0x1


# ---- Errors ----------------------------------------------------------------------------------


class Error(Exception):
    """A ckptdb call failed. `status` is the C status (negative), `message` ckptdb_last_error()."""

    status = 0

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class InvalidError(Error, ValueError):
    pass


class NotFound(Error, LookupError):
    pass


class ExistsError(Error):
    pass


class StateError(Error):
    pass


class CorruptError(Error):
    pass


class IoError(Error, OSError):
    pass


class NoSpaceError(Error, OSError):
    pass


class TimedOutError(Error, TimeoutError):
    pass


class NoMemoryError(Error, MemoryError):
    pass


class SizeError(Error, ValueError):
    pass


class NotSupportedError(Error):
    pass


class BusyError(Error):
    pass


class InternalError(Error):
    pass


class SkippedError(Error):
    pass


class PeerError(Error):
    pass


class AuthError(Error):
    pass


_ERRORS = {
    -1: InvalidError,
    -2: NotFound,
    -3: ExistsError,
    -4: StateError,
    -5: CorruptError,
    -6: IoError,
    -7: NoSpaceError,
    -8: TimedOutError,
    -9: NoMemoryError,
    -10: SizeError,
    -11: NotSupportedError,
    -12: BusyError,
    -13: InternalError,
    -14: SkippedError,
    -15: PeerError,
    -16: AuthError,
}
_TIMED_OUT = -8  # CKPTDB_ETIMEDOUT

# ---- The C structures ------------------------------------------------------------------------


class _Options(ctypes.Structure):
    _fields_ = [
        ("root", ctypes.c_char_p),
        ("tiers", ctypes.c_char_p),
        ("commit_tier", ctypes.c_char_p),
        ("backpressure", ctypes.c_char_p),
        ("rank", ctypes.c_uint32),
        ("world_size", ctypes.c_uint32),
        ("node_id", ctypes.c_char_p),
        ("coordinator", ctypes.c_char_p),
        ("redundancy", ctypes.c_char_p),
        ("job_token", ctypes.c_char_p),
        ("staging_bytes", ctypes.c_uint64),
        ("chunk_bytes", ctypes.c_uint64),
        ("queue_depth", ctypes.c_uint32),
        ("capture_threads", ctypes.c_uint32),
        ("read_only", ctypes.c_int),
        ("create_if_missing", ctypes.c_int),
        ("drain_on_close", ctypes.c_int),
        ("cpus", ctypes.c_char_p),
        ("drop_tiers", ctypes.c_int),
        ("device", ctypes.c_char_p),
    ]


class _TensorInfo(ctypes.Structure):
    _fields_ = [
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_uint32),
        ("shape", ctypes.c_uint64 * _MAX_DIMS),
        ("global_shape", ctypes.c_uint64 * _MAX_DIMS),
        ("global_offset", ctypes.c_uint64 * _MAX_DIMS),
    ]


class _Shard(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("data", ctypes.c_void_p),
        ("nbytes", ctypes.c_size_t),
        ("info", ctypes.POINTER(_TensorInfo)),
        ("flags", ctypes.c_uint),
    ]


# The same two structures packed by struct, for a batched put: building thousands of ctypes
# structures field by field costs several microseconds a shard, packing them about one.
_INFO_PACK = struct.Struct(f"=iI{3 * _MAX_DIMS}Q")
_SHARD_PACK = struct.Struct("=QQQQI4x")
_INFO_HEAD = [struct.Struct(f"=iI{n}Q") for n in range(_MAX_DIMS + 1)]  # dtype, ndim, shape
_DIMS = [struct.Struct(f"={n}Q") for n in range(_MAX_DIMS + 1)]
_GLOBAL_SHAPE_AT = 8 + 8 * _MAX_DIMS  # ckptdb_tensor_info.global_shape
_GLOBAL_OFFSET_AT = 8 + 16 * _MAX_DIMS


class _TensorDesc(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_uint32),
        ("shape", ctypes.POINTER(ctypes.c_uint64)),
        ("global_shape", ctypes.POINTER(ctypes.c_uint64)),
        ("global_offset", ctypes.POINTER(ctypes.c_uint64)),
        ("nbytes", ctypes.c_uint64),
        ("chunk_count", ctypes.c_uint32),
        ("kept_bytes", ctypes.c_uint64),
        ("parity_chunks", ctypes.c_uint32),
        ("parity_bytes", ctypes.c_uint64),
        ("recomputed", ctypes.c_uint32),
    ]


class _Box(ctypes.Structure):
    _fields_ = [
        ("ndim", ctypes.c_uint32),
        ("offset", ctypes.c_uint64 * _MAX_DIMS),
        ("shape", ctypes.c_uint64 * _MAX_DIMS),
    ]


_ListFn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(_TensorDesc))


@dataclass(frozen=True)
class TensorDesc:
    """One tensor of a committed version (ckptdb_list): its shard's shape and size, and where the
    shard lies in the global tensor when it was put with one (else None)."""

    name: str
    dtype: str
    shape: Tuple[int, ...]
    nbytes: int
    global_shape: Optional[Tuple[int, ...]]
    global_offset: Optional[Tuple[int, ...]]


# ---- The library -----------------------------------------------------------------------------


def library_path() -> str:
    """Where libckptdb.so is loaded from: $CKPTDB_LIBRARY, else the package's own (a pip
    install puts it there), else the build tree next to this package (build/libckptdb.so), else
    the system's (ctypes.util.find_library, after `make install`)."""
    env = os.environ.get("CKPTDB_LIBRARY")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    packaged = os.path.join(here, "libckptdb.so")
    if os.path.exists(packaged):
        return packaged
    built = os.path.join(here, "..", "..", "build", "libckptdb.so")
    if os.path.exists(built):
        return os.path.normpath(built)
    found = ctypes.util.find_library("ckptdb")
    if found:
        return found
    raise ImportError(
        "libckptdb.so not found: build ckptdb (make), install it, or set CKPTDB_LIBRARY")


_lib = ctypes.CDLL(library_path())


def _sig(name, restype, *argtypes):
    f = getattr(_lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


_c_db = ctypes.c_void_p
_options_init = _sig("ckptdb_options_init", None, ctypes.POINTER(_Options))
_open = _sig("ckptdb_open", ctypes.c_int, ctypes.POINTER(_Options), ctypes.POINTER(_c_db))
_close = _sig("ckptdb_close", ctypes.c_int, _c_db)
_put_shard = _sig("ckptdb_put_shard", ctypes.c_int, _c_db, ctypes.c_uint64, ctypes.c_char_p,
                  ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(_TensorInfo), ctypes.c_uint)
_put_shards = _sig("ckptdb_put_shards", ctypes.c_int, _c_db, ctypes.c_uint64, ctypes.c_void_p,
                   ctypes.c_size_t)
_wait_capture = _sig("ckptdb_wait_capture", ctypes.c_int, _c_db, ctypes.c_uint64, ctypes.c_int)
_commit = _sig("ckptdb_commit", ctypes.c_int, _c_db, ctypes.c_uint64, ctypes.c_uint)
_wait_commit = _sig("ckptdb_wait_commit", ctypes.c_int, _c_db, ctypes.c_uint64, ctypes.c_char_p,
                    ctypes.c_int)
_abort = _sig("ckptdb_abort", ctypes.c_int, _c_db, ctypes.c_uint64)
_declare_replicas = _sig("ckptdb_declare_replicas", ctypes.c_int, _c_db, ctypes.c_uint32,
                         ctypes.POINTER(ctypes.c_uint32), ctypes.c_size_t, ctypes.c_char_p)
# For ckptdb._native, which calls them without ctypes (ckptdb.torch's save).
_PUT_SHARDS_AT = ctypes.cast(_put_shards, ctypes.c_void_p).value
_ABORT_AT = ctypes.cast(_abort, ctypes.c_void_p).value
_latest = _sig("ckptdb_latest", ctypes.c_int, _c_db, ctypes.POINTER(ctypes.c_uint64))
_restore = _sig("ckptdb_restore", ctypes.c_int, _c_db, ctypes.c_uint64, ctypes.c_char_p,
                ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint)
_restore_slice = _sig("ckptdb_restore_slice", ctypes.c_int, _c_db, ctypes.c_uint64,
                      ctypes.c_char_p, ctypes.POINTER(_Box), ctypes.c_void_p, ctypes.c_size_t,
                      ctypes.c_uint, ctypes.POINTER(ctypes.c_uint64))
_list = _sig("ckptdb_list", ctypes.c_int, _c_db, ctypes.c_uint64, _ListFn, ctypes.c_void_p)
_last_error = _sig("ckptdb_last_error", ctypes.c_char_p)
_dtype_name = _sig("ckptdb_dtype_name", ctypes.c_char_p, ctypes.c_int)
_dtype_bytes = _sig("ckptdb_dtype_bytes", ctypes.c_size_t, ctypes.c_int)


def _version(version, call: str) -> int:
    """A version as the C API takes it: an int in 0 .. 2**64 - 2 (2**64 - 1 is
    CKPTDB_ALL_VERSIONS). Refused, not wrapped: ctypes would turn 2**64 + 7 into 7 and -1 into
    the reserved value."""
    if isinstance(version, bool) or not isinstance(version, numbers.Integral):
        raise TypeError(f"{call}: a version is an int, not {type(version).__name__}")
    value = int(version)
    if not 0 <= value < ALL_VERSIONS:
        raise InvalidError(-1, f"{call}: version {value} is outside 0 .. 2**64 - 2")
    return value


def _check(status: int) -> None:
    if status == 0:
        return
    message = (_last_error() or b"").decode("utf-8", "replace")
    raise _ERRORS.get(status, Error)(status, message)


def _text(value: Optional[str], what: str) -> Optional[bytes]:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if "\0" in value:
        raise ValueError(f"{what} {value!r} contains a NUL byte")
    return value.encode("utf-8")


# ---- Buffers ---------------------------------------------------------------------------------


def name_bytes(name: str) -> bytes:
    """A tensor name as the C API takes it (UTF-8, no NUL)."""
    return _text(name, "name")


def buffer_address(data: bytes) -> Tuple[int, int, object]:
    """(address, nbytes, what keeps it alive) of a bytes object (for Store._put_many)."""
    return _address(data, writable=False, what="a buffer")


def _address(buffer, writable: bool, what: str) -> Tuple[int, int, object]:
    """(address, nbytes, what keeps the memory alive) of a buffer, with no copy."""
    if hasattr(buffer, "data_ptr") and hasattr(buffer, "element_size"):  # a torch.Tensor
        kind = getattr(getattr(buffer, "device", None), "type", "cpu")
        if kind not in ("cpu", "cuda"):
            raise ValueError(f"{what}: a tensor on {buffer.device}; ckptdb reads CPU memory, "
                             "and CUDA memory in a CUDA build of libckptdb")
        if not buffer.is_contiguous():
            raise ValueError(f"{what}: a tensor that is not contiguous (call .contiguous())")
        if buffer.is_neg() or buffer.is_conj():  # its memory holds the values before that
            raise ValueError(f"{what}: a negative or conjugate view (call .resolve_neg() and "
                             ".resolve_conj())")
        return buffer.data_ptr(), buffer.numel() * buffer.element_size(), buffer
    if isinstance(buffer, bytes):
        if writable:
            raise TypeError(f"{what}: bytes are read-only; restore into a bytearray or array")
        keep = ctypes.c_char_p(buffer)  # points at the bytes object's own storage
        return ctypes.cast(keep, ctypes.c_void_p).value or 0, len(buffer), (buffer, keep)
    try:
        view = memoryview(buffer)
    except TypeError:
        raise TypeError(
            f"{what}: a {type(buffer).__name__} is neither a buffer nor a tensor") from None
    if not view.c_contiguous:
        raise ValueError(f"{what}: the buffer is not C-contiguous")
    if view.readonly:
        if writable:
            raise TypeError(f"{what}: the buffer is read-only")
        if isinstance(view.obj, bytes) and view.nbytes == len(view.obj):
            return _address(view.obj, writable, what)
        raise TypeError(f"{what}: a read-only buffer that is not a whole bytes object")
    nbytes = view.nbytes
    if nbytes == 0:
        return 0, 0, view
    flat = view.cast("B")
    anchor = (ctypes.c_char * nbytes).from_buffer(flat)
    return ctypes.addressof(anchor), nbytes, (view, flat, anchor)


def _on_gpu(buffer) -> bool:
    """A CUDA tensor: put and restored with the device flags (ENOTSUP from a host build). The
    work queued on its device's current stream is waited for first: ckptdb's copies run on
    streams of their own, not ordered after the caller's kernels."""
    if getattr(getattr(buffer, "device", None), "type", "cpu") != "cuda":
        return False
    import torch  # noqa: PLC0415 - a CUDA tensor came from it

    torch.cuda.current_stream(buffer.device).synchronize()
    return True


def _dims(values, what: str) -> Tuple[int, ...]:
    values = tuple(int(d) for d in values)
    if len(values) > _MAX_DIMS:
        raise ValueError(f"{what} {values}: at most {_MAX_DIMS} dimensions")
    if any(d < 0 for d in values):
        raise ValueError(f"{what} {values}: a negative entry")
    return values


def _info(dtype, shape, global_shape=None, global_offset=None) -> Optional[_TensorInfo]:
    if dtype is None and shape is None:
        if global_shape is not None or global_offset is not None:
            raise ValueError("global_shape and global_offset need the shard's dtype and shape")
        return None
    info = _TensorInfo()
    if dtype is not None:
        if isinstance(dtype, str):
            if dtype not in DTYPES:
                raise ValueError(f"dtype {dtype!r}: one of {', '.join(DTYPES)}")
            dtype = DTYPES[dtype]
        info.dtype = int(dtype)
    if shape is not None:
        shape = _dims(shape, "shape")
        info.ndim = len(shape)
        for i, d in enumerate(shape):
            info.shape[i] = d
    if (global_shape is None) != (global_offset is None):
        raise ValueError("global_shape and global_offset go together")
    if global_shape is not None:
        global_shape = _dims(global_shape, "global_shape")
        global_offset = _dims(global_offset, "global_offset")
        if shape is None or len(global_shape) != len(shape) or len(global_offset) != len(shape):
            raise ValueError(f"global_shape {global_shape} and global_offset {global_offset} "
                             f"need one entry per dimension of the shape {shape}")
        for i in range(len(shape)):
            info.global_shape[i] = global_shape[i]
            info.global_offset[i] = global_offset[i]
    return info


# ---- The store -------------------------------------------------------------------------------


class Store:
    """One rank's handle (ckptdb_open). Options as in docs/api.md; None leaves one to the
    environment (CKPTDB_*) or its default. Close it (or use `with`) before the process ends."""

    def __init__(self, root: Optional[str], *, tiers: Optional[str] = None,
                 commit_tier: Optional[str] = None, backpressure: Optional[str] = None,
                 rank: Optional[int] = None, world_size: Optional[int] = None,
                 node_id: Optional[str] = None, coordinator: Optional[str] = None,
                 redundancy: Optional[str] = None, job_token: Optional[str] = None,
                 staging_bytes: int = 0, chunk_bytes: int = 0, queue_depth: int = 0,
                 capture_threads: int = 0, read_only: bool = False,
                 create_if_missing: bool = True, drain_on_close: bool = True,
                 cpus: Optional[str] = None, drop_tiers: bool = False,
                 device: Optional[str] = None):
        o = _Options()
        _options_init(ctypes.byref(o))
        # The encoded strings must live as long as the call: keep them on the object.
        self._strings = {}
        for field, value in (("root", root), ("tiers", tiers), ("commit_tier", commit_tier),
                             ("backpressure", backpressure), ("node_id", node_id),
                             ("coordinator", coordinator), ("redundancy", redundancy),
                             ("job_token", job_token), ("cpus", cpus), ("device", device)):
            encoded = _text(value, field)
            if encoded is not None:
                self._strings[field] = encoded
                setattr(o, field, encoded)
        if rank is not None:
            o.rank = int(rank)
        if world_size is not None:
            o.world_size = int(world_size)
        o.staging_bytes = int(staging_bytes)
        o.chunk_bytes = int(chunk_bytes)
        o.queue_depth = int(queue_depth)
        o.capture_threads = int(capture_threads)
        o.read_only = 1 if read_only else 0
        o.create_if_missing = 1 if create_if_missing else 0
        o.drain_on_close = 1 if drain_on_close else 0
        o.drop_tiers = 1 if drop_tiers else 0
        handle = _c_db()
        _check(_open(ctypes.byref(o), ctypes.byref(handle)))
        self._db = handle
        self._lock = threading.Lock()
        # Calls inside the handle (with the GIL released): close() frees it only once none is.
        self._state = threading.Condition(threading.RLock())
        self._calls = 0
        self._inside: Dict[int, int] = {}  # thread ident -> its calls in the handle
        # Buffers capture may still read, by version: released when it is done with them.
        self._pinned: Dict[int, List[object]] = {}

    # -- lifetime --

    def close(self) -> None:
        """ckptdb_close: waits for the calls other threads have inside the handle and for
        pending demotions (drain_on_close), then frees the handle; a call made meanwhile raises
        StateError, as every call after it does."""
        state = getattr(self, "_state", None)
        if state is None:  # __init__ failed before the handle existed
            return
        with state:  # an RLock: a signal handler may run while this thread holds it
            if self._inside.get(threading.get_ident()):
                raise StateError(-4, "close() from inside a call on this Store on the same "
                                     "thread (a signal handler?): close it once that returns")
            db, self._db = getattr(self, "_db", None), None
            try:
                while self._calls:
                    state.wait()
            except BaseException:
                self._db = db  # not closed (a KeyboardInterrupt): a later close() tries again
                raise
        if db:
            _check(_close(db))
        self._pinned = {}

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - nothing to report to at interpreter shutdown
            pass

    @contextlib.contextmanager
    def _holding(self):
        """The handle, counted as in use until the block ends: close() waits for it."""
        me = threading.get_ident()
        with self._state:
            if not self._db:
                raise StateError(-4, "the store is closed")
            self._calls += 1
            self._inside[me] = self._inside.get(me, 0) + 1
            db = self._db
        try:
            yield db
        finally:
            with self._state:
                self._calls -= 1
                self._inside[me] -= 1
                if not self._inside[me]:
                    del self._inside[me]
                if not self._calls:
                    self._state.notify_all()

    def _call(self, function, *args):
        """function(handle, *args), the handle held for the call (see _holding)."""
        with self._holding() as db:
            return function(db, *args)

    def _release(self, version: int) -> None:
        with self._lock:
            self._pinned.pop(version, None)

    # -- saving --

    def declare_replicas(self, group: int, members: Sequence[int],
                         protection: Optional[str] = None) -> None:
        """ckptdb_declare_replicas: this rank's replica group (ranks holding the same
        data-parallel replicas) and its protection: None or "none", "arc", "aec", "arc+aec", or
        with REFT's AOR "aor" (= "arc+aor"), "aec+aor", "arc+aec+aor" (docs/api.md)."""
        ranks = [int(m) for m in members]
        array = (ctypes.c_uint32 * max(len(ranks), 1))(*ranks)
        _check(self._call(_declare_replicas, int(group), array, len(ranks),
                                 _text(protection, "protection")))

    def put_shard(self, version: int, name: str, data, *, dtype=None, shape=None,
                  global_shape=None, global_offset=None, copy_now: bool = False,
                  replicated: bool = False, recomputed: bool = False) -> None:
        """ckptdb_put_shard: `data` (a buffer or a CPU tensor) as tensor `name` of `version`;
        global_shape and global_offset place it in its global tensor (for restore_slice).
        Without copy_now, capture reads it until wait_capture or a synchronous commit returns;
        the Store holds a reference to it until then. replicated: the same on every member of
        the declared replica group (CKPTDB_PUT_REPLICATED); recomputed: this rank's recomputed
        replica of the next member's private shard `name` (REFT's AOR, CKPTDB_PUT_RECOMPUTED)."""
        version = _version(version, "put_shard")
        address, nbytes, keep = _address(data, writable=False, what=f"put_shard {name!r}")
        if dtype is None and hasattr(data, "dtype") and hasattr(data, "data_ptr"):
            dtype = _torch_dtype(data.dtype)
            if shape is None:
                shape = tuple(data.shape)
        info = _info(dtype, shape, global_shape, global_offset)
        flags = ((_PUT_COPY_NOW if copy_now else 0) | (_PUT_DEVICE if _on_gpu(data) else 0) |
                 (_PUT_REPLICATED if replicated else 0) | (_PUT_RECOMPUTED if recomputed else 0))
        _check(self._call(_put_shard, version, _text(name, "name"), address or None, nbytes,
                          ctypes.byref(info) if info is not None else None, flags))
        if not copy_now:
            with self._lock:
                self._pinned.setdefault(version, []).append(keep)

    def put_shards(self, version: int, shards, *, copy_now: bool = False) -> None:
        """ckptdb_put_shards: every shard of `shards` into `version` in one call, all or none.
        Each is (name, data) or (name, data, global_shape, global_offset), data a buffer or a
        tensor (its dtype and shape recorded, as put_shard does). A refusal names the shard by
        its index; nothing of the call is then put."""
        version = _version(version, "put_shards")
        items = []
        for index, shard in enumerate(shards):
            if len(shard) not in (2, 4):
                raise ValueError(f"put_shards: shard {index} has {len(shard)} fields; "
                                 "(name, data) or (name, data, global_shape, global_offset)")
            name, data = shard[0], shard[1]
            global_shape, global_offset = (shard[2], shard[3]) if len(shard) == 4 else (None, None)
            what = f"put_shards: shard {index} ({name!r})"
            address, nbytes, keep = _address(data, writable=False, what=what)
            dtype = shape = None
            if hasattr(data, "dtype") and hasattr(data, "data_ptr"):
                dtype, shape = _torch_dtype(data.dtype), tuple(data.shape)
            if global_shape is not None or global_offset is not None:
                info = _info(dtype, shape, global_shape, global_offset)  # checks them
                global_shape, global_offset = _dims(global_shape, "g"), _dims(global_offset, "o")
            flags = (_PUT_COPY_NOW if copy_now else 0) | (_PUT_DEVICE if _on_gpu(data) else 0)
            items.append((_text(name, "name"), address, nbytes, keep, dtype, shape, global_shape,
                          global_offset, flags))
        self._put_many(version, items)

    def _put_many(self, version: int, items) -> None:
        """One ckptdb_put_shards call for `items`: (name bytes, address, nbytes, what keeps the
        memory, dtype code or None, shape tuple or None, global_shape, global_offset, flags).
        The descriptors and their infos are packed into two buffers; the names into one."""
        count = len(items)
        if count == 0:
            _check(self._call(_put_shards, version, None, 0))
            return
        names = b"\0".join(item[0] for item in items) + b"\0"
        names_keep = ctypes.c_char_p(names)  # the bytes object's own storage, NUL-terminated
        names_at = ctypes.cast(names_keep, ctypes.c_void_p).value
        infos = bytearray(_INFO_PACK.size * count)
        infos_at = ctypes.addressof((ctypes.c_char * len(infos)).from_buffer(infos))
        descs = bytearray(_SHARD_PACK.size * count)
        descs_at = ctypes.addressof((ctypes.c_char * len(descs)).from_buffer(descs))
        name_at = itertools.accumulate((len(item[0]) + 1 for item in items), initial=names_at)
        info_size = _INFO_PACK.size
        for i, (item, at) in enumerate(zip(items, name_at)):
            _, address, nbytes, _, dtype, shape, global_shape, global_offset, flags = item
            info_at = 0
            if dtype is not None or shape is not None:
                dims = shape or ()
                if len(dims) > _MAX_DIMS:
                    raise ValueError(f"put_shards: shard {i}: shape {dims}: at most {_MAX_DIMS} "
                                     "dimensions")
                # The buffer starts zeroed: only dtype, ndim and the dimensions given are written.
                off = i * info_size
                _INFO_HEAD[len(dims)].pack_into(infos, off, dtype or 0, len(dims), *dims)
                if global_shape is not None:
                    _DIMS[len(dims)].pack_into(infos, off + _GLOBAL_SHAPE_AT, *global_shape)
                    _DIMS[len(dims)].pack_into(infos, off + _GLOBAL_OFFSET_AT, *global_offset)
                info_at = infos_at + off
            _SHARD_PACK.pack_into(descs, i * _SHARD_PACK.size, at, address, nbytes, info_at, flags)
        status = self._call(_put_shards, version, descs_at, count)
        del names_keep
        lazy = [item[3] for item in items if not item[8] & _PUT_COPY_NOW]
        try:
            _check(status)
        except Error:
            # A put refused after it queued its lazy shards (a capture error of a COPY_NOW
            # shard) leaves them to capture: pinned until nothing of the version reads them.
            self._pin(version, lazy)
            self._release_if_unread(version)
            raise
        self._pin(version, lazy)

    def _release_if_unread(self, version: int) -> None:
        """Lets `version`'s pinned buffers go if no capture reads them now (else its
        wait_capture, commit or abort will)."""
        if self._call(_wait_capture, version, 0) != _TIMED_OUT:
            self._release(version)

    def _pin(self, version: int, keep: List[object]) -> None:
        """Keeps `keep` (memory put lazily into `version`) alive until capture ends."""
        if keep:
            with self._lock:
                self._pinned.setdefault(version, []).extend(keep)

    def _put_described(self, version: int, buffer: bytes, descs_at: int, count: int,
                       keep: List[object]) -> None:
        """One ckptdb_put_shards call for `count` descriptors already packed at `descs_at`
        inside `buffer` (ckptdb._native.walk's; the first, the tree record, copied at once);
        `keep` holds the memory of the others until capture ends."""
        status = self._call(_put_shards, version, descs_at, count)
        del buffer  # read by the call only: its names and its record are copied
        _check(status)
        self._pin(version, keep)

    def _sink(self, db, version: int, batch: int, sync) -> tuple:
        """What ckptdb._native.walk needs to put into `version` as it walks: the addresses of
        ckptdb_put_shards and ckptdb_abort, this handle's, the version, the tensors a put, and
        sync(device) for CUDA memory."""
        version = _version(version, "put_shards")
        return (_PUT_SHARDS_AT, _ABORT_AT, db.value, version, batch, sync)

    def wait_capture(self, version: int, timeout_ms: int = -1) -> None:
        """ckptdb_wait_capture: returns once no chunk of `version` reads the caller's buffers."""
        version = _version(version, "wait_capture")
        try:
            _check(self._call(_wait_capture, version, timeout_ms))
        except TimedOutError:
            raise  # capture may still read them: keep the references
        except Error:
            self._release(version)
            raise
        self._release(version)

    def commit(self, version: int, *, wait: bool = True) -> None:
        """ckptdb_commit; wait=False returns at once (CKPTDB_COMMIT_ASYNC)."""
        version = _version(version, "commit")
        status = self._call(_commit, version, 0 if wait else _COMMIT_ASYNC)
        if wait or status != 0:
            self._release(version)  # synchronous: capture is over, whatever the outcome
        _check(status)

    def wait_commit(self, version: int, tier: Optional[str] = None, timeout_ms: int = -1) -> None:
        """ckptdb_wait_commit: until `version` is committed (and durable on `tier`, if given)."""
        version = _version(version, "wait_commit")
        _check(self._call(_wait_commit, version, _text(tier, "tier"), timeout_ms))
        self._release(version)

    def abort(self, version: int) -> None:
        """ckptdb_abort: the version will never be committed; its buffers are free."""
        version = _version(version, "abort")
        try:
            _check(self._call(_abort, version))
        finally:
            self._release(version)

    # -- reading --

    def latest(self) -> Optional[int]:
        """ckptdb_latest: the newest version restorable, or None when there is none."""
        out = ctypes.c_uint64()
        status = self._call(_latest, ctypes.byref(out))
        if status == -2:
            return None
        _check(status)
        return out.value

    def restore(self, version: int, name: str, out) -> None:
        """ckptdb_restore of tensor `name` of `version` into `out`, a writable buffer or a CPU
        tensor of exactly the tensor's size (SizeError otherwise)."""
        version = _version(version, "restore")
        address, nbytes, _keep = _address(out, writable=True, what=f"restore {name!r}")
        flags = _RESTORE_DEVICE if _on_gpu(out) else 0
        _check(self._call(_restore, version, _text(name, "name"), address or None, nbytes,
                        flags))

    def restore_slice(self, version: int, name: str, offset, shape, out) -> int:
        """ckptdb_restore_slice: the part of box [offset, offset + shape) of global tensor
        `name` that this store's shard holds, into `out` (the box, row-major: a writable buffer
        or a CPU tensor of exactly its size). Returns the elements copied (0: the shard misses
        the box); the rest of `out` is left as it was."""
        version = _version(version, "restore_slice")
        offset = _dims(offset, "offset")
        shape = _dims(shape, "shape")
        if len(offset) != len(shape):
            raise ValueError(f"restore_slice {name!r}: offset {offset} and shape {shape} differ "
                             "in length")
        box = _Box()
        box.ndim = len(shape)
        for i in range(len(shape)):
            box.offset[i] = offset[i]
            box.shape[i] = shape[i]
        if _on_gpu(out):
            raise ValueError(f"restore_slice {name!r}: a CUDA tensor; restore the box into CPU "
                             "memory and copy it")
        address, nbytes, _keep = _address(out, writable=True, what=f"restore_slice {name!r}")
        covered = ctypes.c_uint64()
        _check(self._call(_restore_slice, version, _text(name, "name"), ctypes.byref(box),
                              address or None, nbytes, 0, ctypes.byref(covered)))
        return covered.value

    def list(self, version: int) -> List[TensorDesc]:
        """ckptdb_list: the tensors of a committed version, in name order."""
        version = _version(version, "list")
        found: List[TensorDesc] = []
        failure: List[BaseException] = []

        def visit(_arg, desc_ptr):
            try:
                d = desc_ptr.contents
                shape = tuple(d.shape[i] for i in range(d.ndim))
                gshape = (tuple(d.global_shape[i] for i in range(d.ndim))
                          if d.global_shape else None)
                goffset = (tuple(d.global_offset[i] for i in range(d.ndim))
                           if d.global_offset else None)
                found.append(TensorDesc(d.name.decode("utf-8", "replace"),
                                        (_dtype_name(d.dtype) or b"?").decode(), shape,
                                        d.nbytes, gshape, goffset))
                return 0
            except BaseException as e:  # noqa: BLE001 - raised again after the C call returns
                failure.append(e)
                return 1

        callback = _ListFn(visit)
        _check(self._call(_list, version, callback, None))
        if failure:
            raise failure[0]
        return found


_TORCH_DTYPE_NAMES = {
    "torch.bool": "bool", "torch.uint8": "u8", "torch.int8": "i8", "torch.int16": "i16",
    "torch.int32": "i32", "torch.int64": "i64", "torch.float16": "f16",
    "torch.bfloat16": "bf16", "torch.float32": "f32", "torch.float64": "f64",
}


def _torch_dtype(dtype) -> int:
    return DTYPES.get(_TORCH_DTYPE_NAMES.get(str(dtype), "raw"), 0)


# The mirrored structures, for the layout test.
STRUCTURES = {
    "ckptdb_options": _Options,
    "ckptdb_tensor_info": _TensorInfo,
    "ckptdb_shard": _Shard,
    "ckptdb_tensor_desc": _TensorDesc,
    "ckptdb_box": _Box,
}
