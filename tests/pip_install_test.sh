#!/bin/sh
# `pip install ./python` as docs/python.md gives it, tested in `make test`: a fresh venv that sees
# the system's packages, pip with no index (nothing is fetched: Debian's setuptools and wheel
# build it), then the venv's python, with neither CKPTDB_LIBRARY nor PYTHONPATH and from outside
# the tree, imports ckptdb, loads the libckptdb.so installed inside the package (and the native
# walk, when EXPECT_NATIVE is 1), and round-trips a tensor through a store bit for bit.
# The package is built from a copy of python/, so that the build writes nothing into the tree.
# Usage: pip_install_test.sh SOURCE_DIR BUILD_DIR EXPECT_NATIVE
set -eu
src=$1
build=$2
expect_native=${3:-0}
work=$(mktemp -d /var/tmp/ckptdb-test-pip.XXXXXX)
trap 'rm -rf "$work"' EXIT INT TERM
/usr/bin/python3 -m venv --system-site-packages "$work/V"
cp -r "$src/python" "$work/src"
rm -rf "$work/src/build" "$work/src/ckptdb/__pycache__"
CKPTDB_BUILD_DIR="$build" "$work/V/bin/pip" install --quiet --no-build-isolation --no-index \
  --no-deps "$work/src"
cd /
env -u CKPTDB_LIBRARY -u PYTHONPATH -u CKPTDB_NATIVE "$work/V/bin/python" - "$work" \
  "$expect_native" <<'PY'
import os
import sys

import ckptdb

work, expect_native = sys.argv[1], sys.argv[2] == "1"
site = os.path.join(work, "V")
library = ckptdb._capi.library_path()
assert os.path.realpath(library).startswith(os.path.realpath(site) + "/"), library
assert os.path.realpath(ckptdb.__file__).startswith(os.path.realpath(site) + "/"), ckptdb.__file__
root = os.path.join(work, "store")
data = bytes(range(256)) * 1000
with ckptdb.Store(root, tiers="tmpfs:" + os.path.join(work, "t1")) as store:
    store.put_shard(3, "w", data, copy_now=True)
    store.commit(3)
with ckptdb.Store(root, tiers="tmpfs:" + os.path.join(work, "t1")) as store:
    out = bytearray(len(data))
    store.restore(store.latest(), "w", out)
    assert out == data, "the restore is not bit for bit"
if expect_native:
    import ckptdb.torch

    assert ckptdb.torch.NATIVE, "the native walk was built but not installed with the package"
    from ckptdb.torch.dcp import StorageReader, StorageWriter  # noqa: F401 - DCP's plugins
print(f"ok: ckptdb installed by pip loads {library} and restores bit for bit"
      + (" (native walk installed)" if expect_native else ""))
PY
