// libFuzzer target for the catalog's record values (engine/catalog.h: versions, residency,
// figures), which a reader takes from RocksDB files it did not write in this process: any
// bytes as each kind of value, as a commit witness (format/commit_witness.h), and as a catalog
// log for ScanCatalogLog (whose findings must lie inside the input). Every refusal is Corrupt (or
// NotSupported: a newer format); a value that decodes encodes to a value that decodes to the same
// record (older residency formats are written back as the current one) and encodes to the same
// bytes again, and nothing may trip a sanitizer.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "ckptdb/ckptdb.h"
#include "engine/catalog.h"
#include "format/checksum.h"
#include "format/commit_witness.h"

namespace {

using ckpt::Status;
using ckpt::engine::Catalog;

// decode(x) ok => decode(encode(decode(x))) == decode(x), and encode is a fixed point from there.
template <typename Record, typename Decode, typename Encode, typename Same>
void RoundTrip(const std::string& in, Decode decode, Encode encode, Same same) {
  Record first;
  Status st = decode(in, "fuzz", &first);
  if (!st.ok()) {
    // Corrupt, or NotSupported for a record format this build does not read.
    if (st.code() != CKPTDB_ECORRUPT && st.code() != CKPTDB_ENOTSUP) std::abort();
    return;
  }
  const std::string once = encode(first);
  Record second;
  if (!decode(once, "fuzz", &second).ok() || !same(first, second)) std::abort();
  if (encode(second) != once) std::abort();
}

void CheckAll(const std::string& in);

}  // namespace

// Each input as it is, and with its trailing xxh3 made right, so that mutations reach the field
// decoders behind the checksum instead of stopping at it.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string in(reinterpret_cast<const char*>(data), size);
  CheckAll(in);
  if (in.size() >= 9) {
    const uint64_t sum = ckpt::format::Xxh3(in.data(), in.size() - 8);
    std::memcpy(in.data() + in.size() - 8, &sum, 8);
    CheckAll(in);
  }
  return 0;
}

namespace {

void CheckWitnessAndLog(const std::string& in) {
  const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(in.data()), in.size());
  ckpt::format::CommitWitness w;
  Status st = ckpt::format::DecodeCommitWitness(bytes, "fuzz", &w);
  if (st.ok()) {
    const std::vector<uint8_t> again = ckpt::format::EncodeCommitWitness(w);
    if (again.size() != in.size() || std::memcmp(again.data(), in.data(), in.size()) != 0) {
      std::abort();  // every byte is covered: what decodes is exactly what encodes
    }
  } else if (st.code() != CKPTDB_ECORRUPT && st.code() != CKPTDB_ENOTSUP) {
    std::abort();
  }
  ckpt::format::JobDecision d;
  st = ckpt::format::DecodeJobDecision(bytes, "fuzz", &d);
  if (st.ok()) {
    const std::vector<uint8_t> again = ckpt::format::EncodeJobDecision(d);
    if (again.size() != in.size() || std::memcmp(again.data(), in.data(), in.size()) != 0) {
      std::abort();  // every byte of a decision record is read or checked
    }
  } else if (st.code() != CKPTDB_ECORRUPT && st.code() != CKPTDB_ENOTSUP) {
    std::abort();
  }
  const ckpt::engine::LogScan scan = ckpt::engine::ScanCatalogLog(bytes);
  if (scan.damaged && scan.bad_offset >= in.size()) std::abort();
  if (scan.valid_after && (!scan.damaged || scan.next_valid_offset <= scan.bad_offset ||
                           scan.next_valid_offset + 7 > in.size())) {
    std::abort();
  }
}

void CheckAll(const std::string& in) {
  using namespace ckpt::engine;
  CheckWitnessAndLog(in);
  RoundTrip<VersionRecord>(
      in, Catalog::DecodeVersion, Catalog::EncodeVersion,
      [](const VersionRecord& a, const VersionRecord& b) {
        return a.version == b.version && a.state == b.state && a.rank == b.rank &&
               a.data_bytes == b.data_bytes && a.tensor_count == b.tensor_count &&
               a.chunk_count == b.chunk_count && a.created_unix_ns == b.created_unix_ns &&
               a.committed_unix_ns == b.committed_unix_ns && a.manifest_xxh3 == b.manifest_xxh3;
      });
  RoundTrip<ResidencyRecord>(in, Catalog::DecodeResidency, Catalog::EncodeResidency,
                             [](const ResidencyRecord& a, const ResidencyRecord& b) {
                               return a.tier == b.tier && a.state == b.state && a.path == b.path &&
                                      a.file_bytes == b.file_bytes &&
                                      a.ram_generation == b.ram_generation &&
                                      a.ram_index_offset == b.ram_index_offset &&
                                      a.ram_index_bytes == b.ram_index_bytes;
                             });
  RoundTrip<VersionStatsRecord>(
      in, Catalog::DecodeStats, Catalog::EncodeStats,
      [](const VersionStatsRecord& a, const VersionStatsRecord& b) {
        if (a.tiers.size() != b.tiers.size()) return false;
        for (size_t i = 0; i < a.tiers.size(); ++i) {
          if (a.tiers[i].name != b.tiers[i].name ||
              a.tiers[i].bytes_written != b.tiers[i].bytes_written ||
              a.tiers[i].write_ns != b.tiers[i].write_ns) {
            return false;
          }
        }
        return a.bytes == b.bytes && a.put_calls == b.put_calls &&
               a.put_blocked_ns == b.put_blocked_ns &&
               a.wait_capture_blocked_ns == b.wait_capture_blocked_ns &&
               a.commit_blocked_ns == b.commit_blocked_ns && a.capture_ns == b.capture_ns &&
               a.commit_ns == b.commit_ns && a.backpressure_waits == b.backpressure_waits &&
               a.backpressure_wait_ns == b.backpressure_wait_ns &&
               a.direct_chunks == b.direct_chunks &&
               a.staging_high_water_bytes == b.staging_high_water_bytes && a.fsyncs == b.fsyncs;
      });
}

}  // namespace
