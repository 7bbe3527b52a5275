"""ckptdb from Python: the C API (include/ckptdb/ckptdb.h) through ctypes, with no copy through
Python objects (docs/python.md).

    import ckptdb
    with ckptdb.Store("/var/lib/ckpt/rank0", tiers="ram:8G,keep=2;disk:/nvme/ck") as store:
        store.put_shard(7, "layer0.weight", weights)   # any C-contiguous buffer, or a tensor
        store.commit(7)
        store.restore(7, "layer0.weight", out)          # into a writable buffer

Buffers go to ckptdb by address: a writable buffer-protocol object (bytearray, memoryview,
array.array, numpy arrays), a `bytes` object, or anything with `data_ptr()` and `nbytes` (a
torch.Tensor, which must be contiguous and on the CPU). A buffer handed to `put_shard` without
`copy_now` is read by capture until `wait_capture` (or a synchronous `commit`) returns; the Store
keeps a reference to it until then, so it cannot be freed under capture, but the caller must not
change it before that point (docs/api.md, "Buffers are the caller's again after wait_capture").

Every failing call raises `ckptdb.Error` (a subclass per status: `NotFound`, `StateError`,
`CorruptError`, ...) whose message is `ckptdb_last_error()`, the C API's full sentence.
"""

from ckptdb._capi import (  # noqa: F401
    ALL_VERSIONS,
    DTYPES,
    AuthError,
    BusyError,
    CorruptError,
    Error,
    ExistsError,
    InternalError,
    InvalidError,
    IoError,
    NoMemoryError,
    NoSpaceError,
    NotFound,
    NotSupportedError,
    PeerError,
    SizeError,
    SkippedError,
    StateError,
    Store,
    TensorDesc,
    TimedOutError,
    library_path,
)

__all__ = [
    "ALL_VERSIONS",
    "DTYPES",
    "AuthError",
    "BusyError",
    "CorruptError",
    "Error",
    "ExistsError",
    "InternalError",
    "InvalidError",
    "IoError",
    "NoMemoryError",
    "NoSpaceError",
    "NotFound",
    "NotSupportedError",
    "PeerError",
    "SizeError",
    "SkippedError",
    "StateError",
    "Store",
    "TensorDesc",
    "TimedOutError",
    "library_path",
]
