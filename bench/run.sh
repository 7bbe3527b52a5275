#!/usr/bin/env bash
# Runs the benchmarks against their physical limits; the figures go into docs/performance.md.
# Usage: bench/run.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
echo "== commit/restore of 2 GiB on a tmpfs tier =="
"$build/bench_commit_restore" --dir /dev/shm/ckptdb-bench --gib 2 --tensor-mib 64 --repeats 5
echo
echo "== commit/restore of 1 GiB on a disk tier (O_DIRECT) =="
"$build/bench_commit_restore" --dir /var/tmp/ckptdb-bench --gib 1 --tensor-mib 64 --repeats 3
