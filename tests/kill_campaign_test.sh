#!/bin/sh
# The short kill campaign of `make test` (docs/testing.md, "Kill campaign"): a job of 4 ranks on
# 4 simulated nodes (replicate:2) through 12 rounds of restart, restore, train and a random
# SIGKILL of a rank, the coordinator, a node (wiped) or the whole job; every restart's latest
# version is checked bit for bit on every rank. The long one: the same command with
# --kill-rounds 1000 and any --seed. With PROTECTION (arc, aec, arc+aec, aor, ...) the ranks are one
# replica group with REFT's protection instead (redundancy none), 4 MiB each so that their
# tensors are cut among the members. With REDUNDANCY (ec:2+2, ec:2+2,encode=sender, ...) the job's
# redundancy is that instead of replicate:2 (PROTECTION empty).
# Usage: kill_campaign_test.sh CKPTDB_CLI [ROUNDS] [SEED] [PROTECTION] [REDUNDANCY]
set -eu
cli="$1"
rounds="${2:-12}"
seed="${3:-1}"
group=""
if [ -n "${4:-}" ]; then group="--protection $4 --mib-per-rank 4"; else group="--mib-per-rank 2"; fi
if [ -n "${5:-}" ]; then group="$group --redundancy $5"; fi
disk=$(mktemp -d /var/tmp/ckptdb-test-kill.XXXXXX)
mem=$(mktemp -d /dev/shm/ckptdb-test-kill.XXXXXX)
trap 'rm -rf "$disk" "$mem"' EXIT INT TERM
# shellcheck disable=SC2086
"$cli" demo --ranks 4 --nodes 4 --kill-rounds "$rounds" --seed "$seed" $group \
  --compute-ms 20 --root "$disk/job" --ram-dir "$mem/job"
