#!/usr/bin/env bash
# Installs the build into a temporary prefix and checks what a user gets: headers, both
# libraries, the ckptdb command, a CMake package (find_package) and a pkg-config file, and a
# shared library that exports only the C API.
# Usage: tests/install_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1
build=$2
work=$(mktemp -d /var/tmp/ckptdb-install-XXXXXX)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

cmake --install "$build" --prefix "$prefix" >/dev/null
for f in include/ckptdb/ckptdb.h lib/libckptdb.so lib/libckptdb.a bin/ckptdb \
         lib/cmake/ckptdb/ckptdbConfig.cmake lib/pkgconfig/ckptdb.pc; do
  [ -e "$prefix/$f" ] || { echo "FAIL: $f was not installed"; exit 1; }
done

# Only ckptdb_* symbols leave the shared library (cmake/ckptdb.map).
leaked=$(nm -D --defined-only "$prefix/lib/libckptdb.so" | awk '{print $3}' | grep -v '^ckptdb_' || true)
if [ -n "$leaked" ]; then
  echo "FAIL: libckptdb.so exports symbols outside the C API:"; echo "$leaked" | head -20; exit 1
fi
exported=$(nm -D --defined-only "$prefix/lib/libckptdb.so" | grep -c ' ckptdb_')
echo "libckptdb.so exports $exported ckptdb_* symbols and nothing else"

# find_package(ckptdb): shared and static.
cmake -S "$src/tests/install_consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/consumer" -j2 >/dev/null
LD_LIBRARY_PATH="$prefix/lib" "$work/consumer/consumer_shared" "$work/store-shared"
"$work/consumer/consumer_static" "$work/store-static"

# pkg-config.
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
cc -o "$work/consumer_pc" "$src/tests/install_consumer/consumer.c" $(pkg-config --cflags --libs ckptdb)
LD_LIBRARY_PATH="$prefix/lib" "$work/consumer_pc" "$work/store-pc"

"$prefix/bin/ckptdb" --help >/dev/null
echo "install test passed"
