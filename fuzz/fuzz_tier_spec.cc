// libFuzzer target for the tier spec parser (io/tier_spec.h, docs/api.md "Tier specs"): any bytes
// as a spec, from CKPTDB_TIERS or a caller's options. A spec that parses must format back
// (FormatTierSpec, what the catalog records for the read-only tools) to text that parses to the
// very same tiers; one that does not gets an Invalid or NotSupported status naming a tier, never
// a crash, a hang or a sanitizer report.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "ckptdb/ckptdb.h"
#include "io/tier_spec.h"

namespace {

bool Same(const ckpt::io::TierSpec& a, const ckpt::io::TierSpec& b) {
  return a.kind == b.kind && a.path == b.path && a.keep == b.keep && a.every == b.every &&
         a.capacity_bytes == b.capacity_bytes && a.replica_bytes == b.replica_bytes &&
         a.name == b.name && a.host == b.host && a.remote_dir == b.remote_dir && a.port == b.port &&
         a.mount_port == b.mount_port;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckpt::io;
  const std::string_view spec(reinterpret_cast<const char*>(data), size);
  std::vector<TierSpec> tiers;
  ckpt::Status st = ParseTierSpecs(spec, "/fuzz/base", &tiers);
  if (!st.ok()) {
    // Refusals say what was refused: never OK with nothing, never an I/O-like code.
    if (st.code() != CKPTDB_EINVAL && st.code() != CKPTDB_ENOTSUP) std::abort();
    if (st.message().empty() || !tiers.empty()) std::abort();
    return 0;
  }
  if (tiers.empty() || tiers.size() > CKPTDB_MAX_TIERS) std::abort();
  std::string canonical;
  for (size_t i = 0; i < tiers.size(); ++i) {
    const TierSpec& t = tiers[i];
    if (t.every == 0) std::abort();
    if (t.kind == TierKind::kNfs) {
      // An nfs tier's path is the nfs:// path of its server and absolute directory.
      if (!t.path.starts_with("nfs://") || t.remote_dir.empty() || t.remote_dir[0] != '/' ||
          t.host.empty()) {
        std::abort();
      }
    } else if (t.path.empty() || t.path[0] != '/') {
      std::abort();
    }
    if (t.kind == TierKind::kRam &&
        (i != 0 || t.capacity_bytes < kMinRamBytes || t.capacity_bytes > kMaxRamBytes ||
         t.capacity_bytes % 4096 != 0)) {
      std::abort();
    }
    canonical += (i ? ";" : "") + FormatTierSpec(t);
  }
  std::vector<TierSpec> again;
  if (!ParseTierSpecs(canonical, "/elsewhere", &again).ok() || again.size() != tiers.size()) {
    std::abort();
  }
  for (size_t i = 0; i < tiers.size(); ++i) {
    if (!Same(tiers[i], again[i])) std::abort();
  }
  return 0;
}
