#!/bin/sh
# Eight ranks a node (issue 41): the many-rank demo with 32 ranks on 4 nodes, replication between
# nodes only, one arena directory a node; the lost node's 8 ranks restore from their peers'
# memory, the others from their own, bit for bit (the demo checks; exit 0 only then). Also with
# back-pressure's skip, whose job restores its newest committed version. Cleans up after itself.
# Usage: demo_many_ranks_test.sh CKPTDB_CLI
set -eu
cli=$1
tmp=$(mktemp -d /tmp/ckptdb-test-demo32-XXXXXX)
shm=/dev/shm/ckptdb-test-demo32-$$
trap 'rm -rf "$tmp" "$shm"' EXIT
for bp in block skip; do
  out=$tmp/out-$bp.txt
  if ! "$cli" demo --ranks 32 --nodes 4 --mib-per-rank 1 --iterations 3 --backpressure $bp \
      --root "$tmp/root" --ram-dir "$shm" >"$out" 2>&1; then
    cat "$out"
    echo "demo_many_ranks_test: the 32-rank demo (--backpressure $bp) failed"
    exit 1
  fi
  for want in "node0: 8 rank(s)" "node3: 8 rank(s)" "ok: every rank restored"; do
    if ! grep -qF "$want" "$out"; then
      cat "$out"
      echo "demo_many_ranks_test: no '$want' in the demo's output (--backpressure $bp)"
      exit 1
    fi
  done
  # node3's 8 ranks from their peers' memory, the 24 others from their own ram tier.
  peers=$(grep -cE '^ +[0-9]+ +node3 .* peer:rank[0-9]+ .* yes$' "$out" || true)
  own=$(grep -cE '^ +[0-9]+ +node[012] .* ram [0-9.]+ MiB .* yes$' "$out" || true)
  if [ "$peers" != 8 ] || [ "$own" != 24 ]; then
    cat "$out"
    echo "demo_many_ranks_test: $peers ranks restored from peers (want 8), $own from their own ram (want 24)"
    exit 1
  fi
done
echo "demo_many_ranks_test: 32 ranks on 4 nodes, with block and skip: ok"
