#!/usr/bin/env bash
# Installs, from Debian 12's archive only, whatever ckptdb's build, tests and fuzzers need and
# this machine lacks. Safe to run repeatedly: it asks apt only when a package is missing.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  liburing-dev            # io_uring engine (io/)
  libnfs-dev              # the nfs tier's NFSv3 client, no kernel mount (io/nfs_io)
  nfs-ganesha nfs-ganesha-vfs rpcbind  # a real NFS server in user space for the nfs tests
  libflatbuffers-dev flatbuffers-compiler  # manifest schema + flatc (format/)
  libxxhash-dev           # xxh3-64 chunk checksums (format/)
  libucx-dev ucx-utils    # transport between ranks (transport/); ucx_perftest for bench/
  libsodium-dev           # job-token authentication of every connection (transport/)
  libisal-dev             # Reed-Solomon and XOR coding of coding groups (engine/erasure_code)
  iproute2                # network namespaces in the multi-node tests
  librocksdb-dev          # catalog (engine/)
  libgtest-dev libgmock-dev  # tests
  libcli11-dev            # the ckptdb command line (tools/)
  nlohmann-json3-dev      # ckptdb inspect --json (tools/)
  clang-14 libclang-rt-14-dev  # libFuzzer targets (fuzz/)
  python3 python3-torch   # the Python package and its PyTorch training test (python/)
  python3-venv python3-wheel python3-setuptools  # pip install of python/ into a venv (docs/python.md)
  python3-matplotlib      # the demo's plot (a PNG beside the run), when installed
  python3-dev libtorch-dev pybind11-dev  # ckptdb.torch's native walk (python/native/)
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  SUDO=sudo
else
  SUDO=
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
