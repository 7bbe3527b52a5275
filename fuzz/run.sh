#!/usr/bin/env bash
# Runs the libFuzzer targets over copies of their seed corpora (docs/format.md, "Fuzzing").
#
#   fuzz/run.sh BUILD_DIR SECONDS [TARGET...]
#
# BUILD_DIR is the main build directory: the fuzzers are in BUILD_DIR/fuzz (built by the main
# CMakeLists.txt with clang++-14 when CKPTDB_BUILD_FUZZERS is ON). With no TARGET every fuzz_*
# binary there runs, each for SECONDS. `make fuzz FUZZ_SECONDS=600` runs this; ctest runs it
# for 15 seconds a target as fuzz_<name>_smoke.
#
# Each run starts from a temporary copy of fuzz/corpus/<name>/, so new inputs found along the way
# never land in the committed corpus. A crash leaves its input in BUILD_DIR/fuzz/artifacts/ and
# makes this script exit non-zero; reproduce it with `BUILD_DIR/fuzz/<target> <artifact>`.
set -euo pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: $0 BUILD_DIR SECONDS [TARGET...]" >&2
  exit 2
fi
build_dir=$1
seconds=$2
shift 2
if ! [[ $seconds =~ ^[0-9]+$ ]] || [[ $seconds -lt 1 ]]; then
  echo "$0: SECONDS must be a positive whole number, not '$seconds'" >&2
  exit 2
fi

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bin_dir=$build_dir/fuzz
if [[ $# -gt 0 ]]; then
  targets=("$@")
else
  targets=()
  for f in "$bin_dir"/fuzz_*; do
    [[ -f $f && -x $f ]] && targets+=("$(basename "$f")")
  done
fi
if [[ ${#targets[@]} -eq 0 ]]; then
  echo "$0: no fuzz_* binaries in $bin_dir: configure with -DCKPTDB_BUILD_FUZZERS=ON on a" \
    "machine with clang++-14 (and libclang-rt-14-dev), then build" >&2
  exit 1
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/ckptdb-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
artifacts=$bin_dir/artifacts
mkdir -p "$artifacts"

failed=()
for target in "${targets[@]}"; do
  exe=$bin_dir/$target
  if [[ ! -x $exe ]]; then
    echo "$0: $exe is missing: build the fuzzers first" >&2
    failed+=("$target")
    continue
  fi
  name=${target#fuzz_}
  corpus=$work/$name
  mkdir -p "$corpus"
  if [[ -d $here/corpus/$name ]]; then
    cp -R "$here/corpus/$name/." "$corpus/"
  fi
  echo "== $target: ${seconds}s from $(find "$corpus" -type f | wc -l) seed inputs"
  # -timeout: one input running 10 s is a hang; -rss_limit_mb: a bounded reader never needs 2 GiB;
  # -max_len: segments in the corpus are under 64 KiB, and larger inputs only slow the search.
  if ! "$exe" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="$artifacts/$target-" "$corpus"; then
    echo "== $target FAILED: see the report above; inputs in $artifacts:" >&2
    ls -1 "$artifacts" | grep "^$target-" >&2 || true
    failed+=("$target")
  fi
done

if [[ ${#failed[@]} -gt 0 ]]; then
  echo "$0: failed: ${failed[*]}" >&2
  exit 1
fi
echo "== all fuzzers ran clean: ${targets[*]}"
