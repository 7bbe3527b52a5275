#!/usr/bin/env bash
# Runs the benchmarks against their physical limits; the figures go into docs/performance.md.
# Usage: bench/run.sh [BUILD_DIR]   (about 12 minutes on the 2-core VM; needs ~9 GiB of memory,
# /dev/shm and /var/tmp; bench_cluster runs ucx_perftest from ucx-utils, and its throttled tier
# needs root for a blkio/io cgroup: without one it says so and measures the rest)
set -euo pipefail
build=${1:-build}
echo "== copy and hash in pieces: the piece size capture uses =="
"$build/bench_copy_hash" --gib 2 --repeats 3
echo
echo "== issue 3: blocked time, capture, drain, restore (2 GiB in 128 shards) =="
"$build/bench_async" --mode all --gib 2 --shards 128 --iterations 8
echo
echo "== issue 3: checkpoint-frequency sweep (512 MiB, flush-bound and compute-bound trainer) =="
"$build/bench_async" --mode sweep --gib 0.5 --shards 64 --iterations 10
echo
echo "== issue 23: 100,000 shards of 256 bytes: the batched put against its descriptors' memcpy =="
"$build/bench_async" --mode many --repeats 5
echo
echo "== issue 23: a 1 GiB shard put lazily, 20 runs on new arenas: blocked time's distribution =="
"$build/bench_async" --mode stall --gib 1 --runs 20
echo
echo "== issue 24: demotion to and restore from an nfs tier against raw libnfs (nfs-ganesha on"
echo "   loopback, tests/support's nfs_fixture; 256 MiB, 9 rounds) =="
nfs_work=$(mktemp -d /var/tmp/ckptdb-bench-nfs-XXXXXX)
mkdir -p "$nfs_work/export" "$nfs_work/server"
exec {nfs_in}> >("$build/tests/nfs_fixture" "$nfs_work/export" "$nfs_work/server" > "$nfs_work/ports")
for _ in $(seq 100); do [[ -s $nfs_work/ports ]] && break; sleep 0.1; done
read -r nfs_port nfs_mount_port < "$nfs_work/ports"
"$build/bench_nfs" --export "$nfs_work/export" --port "$nfs_port" --mountport "$nfs_mount_port" \
  --mib 256 --rounds 9
exec {nfs_in}>&-  # the fixture stops the server when its stdin closes
sleep 1
rm -rf "$nfs_work"
echo
echo "== issue 40: what syncing every catalog write costs a small commit (disk, then tmpfs) =="
"$build/bench_catalog_sync" --dir /var/tmp/ckptdb-bench-sync --versions 200 --rounds 5
"$build/bench_catalog_sync" --dir /dev/shm/ckptdb-bench-sync --versions 200 --rounds 5
echo
echo "== commit/restore of 2 GiB on a tmpfs tier =="
"$build/bench_commit_restore" --dir /dev/shm/ckptdb-bench --gib 2 --tensor-mib 64 --repeats 5
echo
echo "== commit/restore of 1 GiB on a disk tier (O_DIRECT) =="
"$build/bench_commit_restore" --dir /var/tmp/ckptdb-bench --gib 1 --tensor-mib 64 --repeats 3
echo
echo "== issues 4, 21: replication to a peer's memory against ucx_perftest (2 ranks, 512 MiB each):"
echo "   tcp: ckptdb's socket against ucp_am_bw; shm: one-sided windows against ucp_put_bw =="
"$build/bench_cluster" --mode replicate --mib 512 --tls tcp --tls shm
echo
echo "== issue 4: commit latency on 1, 2, 4, 8 ranks (4 MiB a rank, replicate:2 and none) =="
"$build/bench_cluster" --mode commit --commit-kib 4096 --versions 20 --ranks 2,4,8 --tls tcp
echo
echo "== the machine: tcp receive into memory the kernel never wrote, and into memory it did =="
"$build/bench_tcp_first_receive" 512
echo
echo "== issues 4, 21: restore of 512 MiB from a peer's memory, a disk tier and a throttled one =="
"$build/bench_cluster" --mode restore --mib 512 --repeats 5 --tls tcp
"$build/bench_cluster" --mode restore --mib 512 --repeats 5 --tls shm
echo
echo "== issue 21: commit latency of 2 ranks with strangers hammering the coordinator's port =="
"$build/bench_cluster" --mode hostile --versions 60 --repeats 4 --tls tcp
echo
echo "== issue 5, 25: encode, a holder's accumulation, a sender's partials and decode against bare ISA-L =="
"$build/bench_erasure" --block-mib 16 --repeats 9 --codes 2+2,4+2,8+2,6+3
echo
echo "== issue 5: replicate:2 against ec:2+2, xor:3, ec:4+2, ec:6+2 on 4, 6 and 8 nodes =="
"$build/bench_cluster" --mode coding --mib 64 --tls tcp
echo
echo "== issue 5: REFT's ARC against plain replica groups of 2, 4 and 8 ranks (128 MiB each) =="
"$build/bench_cluster" --mode arc --mib 128 --ranks 2,4,8 --tls tcp
echo
echo "== issue 25: GEMINI's interleaving, 2 ranks over a tc-shaped veth (root: network namespaces) =="
"$build/bench_interleave" --sizes 1,2,3,4,6 --iterations 200 --rounds 2 || \
  echo "bench_interleave failed or could not make its namespaces (it says why above)"
echo
echo "== issue 25: ECHECK's encoding at the senders against at the holders, tc-shaped links (root) =="
"$build/bench_encode" --codes ec:2+2,ec:4+2 --mib 32 --versions 8 --warmup 2 --rounds 3 \
  --rate-mbit 400 || echo "bench_encode failed or could not make its namespaces (it says why above)"
"$build/bench_encode" --codes ec:2+2,ec:4+2 --mib 32 --versions 8 --warmup 2 --rounds 3 \
  --rate-mbit 4000 || echo "bench_encode failed or could not make its namespaces (it says why above)"
echo
echo "== issue 7: ckptdb.torch against torch.save, torch.load and DCP on one 2 GiB state =="
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  CKPTDB_LIBRARY="$build/libckptdb.so" PYTHONPATH="$(dirname "$0")/../python" \
    /usr/bin/python3 "$(dirname "$0")/bench_torch.py" --threads 2
  echo
  echo "== issue 23: ckptdb.torch save of 5,000 and 50,000 tensors of 1 KiB against torch.save =="
  CKPTDB_LIBRARY="$build/libckptdb.so" PYTHONPATH="$(dirname "$0")/../python" \
    /usr/bin/python3 "$(dirname "$0")/bench_many.py"
  CKPTDB_LIBRARY="$build/libckptdb.so" PYTHONPATH="$(dirname "$0")/../python" \
    /usr/bin/python3 "$(dirname "$0")/bench_many.py" --tensors 50000 --repeats 3
  echo
  echo "== issue 23: the small model, a save every step, one training thread =="
  CKPTDB_LIBRARY="$build/libckptdb.so" PYTHONPATH="$(dirname "$0")/../python" \
    /usr/bin/python3 "$(dirname "$0")/bench_torch.py" --small-only --threads 1
  echo
  echo "== issue 26: DCP's save and load through ckptdb.torch.dcp against FileSystemWriter into tmpfs =="
  CKPTDB_LIBRARY="$build/libckptdb.so" PYTHONPATH="$(dirname "$0")/../python" \
    /usr/bin/python3 "$(dirname "$0")/bench_torch.py" --dcp-only --repeats 5 --threads 2
  echo
  echo "== issue 25: REFT's AOR, a keeper's recomputed Adam/AdamW shard against the owner's step =="
  CKPTDB_LIBRARY="$build/libckptdb.so" PYTHONPATH="$(dirname "$0")/../python" \
    /usr/bin/python3 "$(dirname "$0")/bench_aor.py" --threads 1
else
  echo "skipped: /usr/bin/python3 has no torch (apt-get install python3-torch)"
fi
