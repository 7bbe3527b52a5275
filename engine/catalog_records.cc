// The catalog's records (catalog.h: Catalog::Encode*/Decode*, VersionStatsRecord) and the scan of
// its write-ahead log (ScanCatalogLog), apart from RocksDB: bytes in, records or a Corrupt
// status naming the record out. docs/format.md, "Catalog".
#include <isa-l/crc.h>

#include <cstring>
#include <string>

#include "engine/catalog.h"
#include "engine/catalog_codec.h"
#include "format/checksum.h"
#include "format/segment_format.h"

namespace ckpt::engine {
namespace catalog_codec {

Status CheckFrame(const std::string& v, const std::string& what, uint8_t min_format,
                  uint8_t max_format) {
  if (v.size() < 9) return Status::Corrupt("catalog record " + what + " is too short");
  uint64_t stored;
  std::memcpy(&stored, v.data() + v.size() - 8, 8);
  uint64_t actual = format::Xxh3(v.data(), v.size() - 8);
  if (stored != actual) {
    return format::Xxh3Corrupt("catalog record " + what, stored, actual);
  }
  const auto format = static_cast<uint8_t>(v[0]);
  if (format < min_format || format > max_format) {
    return Status::NotSupported("catalog record " + what + " has format " +
                                std::to_string(static_cast<uint8_t>(v[0])));
  }
  return Status::Ok();
}

}  // namespace catalog_codec

using namespace catalog_codec;

namespace {

// CRC-32C as RocksDB's log computes it (crc32c::Value, Extend, Mask), on ISA-L's crc32_iscsi,
// which keeps the register uncomplemented: crc32c(data) = ~crc32_iscsi(data, ~0).
uint32_t Crc32cExtend(uint32_t crc, const uint8_t* data, size_t n) {
  return ~crc32_iscsi(const_cast<uint8_t*>(data), static_cast<int>(n), ~crc);
}
uint32_t UnmaskCrc(uint32_t masked) {
  const uint32_t rot = masked - 0xa282ead8u;
  return (rot >> 17) | (rot << 15);
}

}  // namespace

LogScan ScanCatalogLog(std::span<const uint8_t> log) {
  // RocksDB's write-ahead log (its format is LevelDB's): 32 KiB blocks of records, each a 7-byte
  // header {masked crc32c u32, length u16, type u8} and its payload, never crossing a block;
  // fewer than 7 bytes left in a block are a zero trailer. Types 1-4 are FULL, FIRST, MIDDLE,
  // LAST (the catalog never recycles logs, so the recyclable types do not occur).
  constexpr size_t kBlock = 32768, kHeader = 7;
  auto record_at = [&](size_t p, bool* zero) -> bool {
    *zero = false;
    const size_t in_block = p % kBlock;
    if (kBlock - in_block < kHeader || log.size() - p < kHeader) return false;
    uint32_t stored;
    uint16_t length;
    std::memcpy(&stored, log.data() + p, 4);
    std::memcpy(&length, log.data() + p + 4, 2);
    const uint8_t type = log[p + 6];
    if (type == 0 && length == 0 && stored == 0) {
      *zero = true;
      return false;
    }
    if (type < 1 || type > 4 || in_block + kHeader + length > kBlock ||
        log.size() - p - kHeader < length) {
      return false;
    }
    uint32_t crc = Crc32cExtend(0, &type, 1);
    crc = Crc32cExtend(crc, log.data() + p + kHeader, length);
    return crc == UnmaskCrc(stored);
  };
  LogScan scan;
  size_t p = 0;
  while (p < log.size()) {
    const size_t in_block = p % kBlock;
    if (kBlock - in_block < kHeader) {
      p += kBlock - in_block;  // the block's trailer
      continue;
    }
    bool zero = false;
    if (record_at(p, &zero)) {
      uint16_t length;
      std::memcpy(&length, log.data() + p + 4, 2);
      p += kHeader + length;
      continue;
    }
    if (zero) {
      // Zeros: space never written (or written out of order by a torn last write). RocksDB's
      // reader drops the rest of the block, so anything but zeros there is damage.
      const size_t block_end = std::min(log.size(), p + (kBlock - in_block));
      if (std::all_of(log.begin() + p, log.begin() + block_end, [](uint8_t b) { return b == 0; })) {
        p = block_end;
        continue;
      }
    }
    scan.damaged = true;
    scan.bad_offset = p;
    break;
  }
  if (!scan.damaged) return scan;
  // A whole record after the bad one that starts a write (FULL or FIRST) is a later write: the
  // damage is not the tail a crash inside the last write leaves.
  for (size_t q = scan.bad_offset + 1; q + kHeader <= log.size(); ++q) {
    const uint8_t type = log[q + 6];
    if (type != 1 && type != 2) continue;
    bool zero = false;
    if (record_at(q, &zero)) {
      scan.valid_after = true;
      scan.next_valid_offset = q;
      break;
    }
  }
  return scan;
}

std::string Catalog::EncodeVersion(const VersionRecord& r) {
  Writer w;
  w.Put<uint8_t>(kRecordFormat);
  w.Put(r.version);
  w.Put<uint8_t>(static_cast<uint8_t>(r.state));
  w.Put(r.rank);
  w.Put(r.data_bytes);
  w.Put(r.tensor_count);
  w.Put(r.chunk_count);
  w.Put(r.created_unix_ns);
  w.Put(r.committed_unix_ns);
  w.Put(r.manifest_xxh3);
  return w.Finish();
}

Status Catalog::DecodeVersion(const std::string& v, const std::string& what, VersionRecord* r) {
  CKPTDB_RETURN_IF_ERROR(CheckFrame(v, what));
  Reader rd(v);
  uint8_t fmt, state;
  if (!rd.Get(&fmt) || !rd.Get(&r->version) || !rd.Get(&state) || !rd.Get(&r->rank) ||
      !rd.Get(&r->data_bytes) || !rd.Get(&r->tensor_count) || !rd.Get(&r->chunk_count) ||
      !rd.Get(&r->created_unix_ns) || !rd.Get(&r->committed_unix_ns) ||
      !rd.Get(&r->manifest_xxh3) || rd.pos() + 8 != v.size()) {
    return Status::Corrupt("catalog record " + what + " has the wrong length");
  }
  if (!ValidState(state)) {
    return Status::Corrupt("catalog record " + what + " has unknown state " +
                           std::to_string(state));
  }
  r->state = state;
  return Status::Ok();
}

std::string Catalog::EncodeResidency(const ResidencyRecord& r) {
  Writer w;
  w.Put<uint8_t>(kResidencyFormat);
  w.Put<uint8_t>(static_cast<uint8_t>(r.state));
  w.Put(r.file_bytes);
  w.PutBytes(r.tier);
  w.PutBytes(r.path);
  w.Put(r.ram_generation);
  w.Put(r.ram_index_offset);
  w.Put(r.ram_index_bytes);
  return w.Finish();
}

Status Catalog::DecodeResidency(const std::string& v, const std::string& what, ResidencyRecord* r) {
  CKPTDB_RETURN_IF_ERROR(CheckFrame(v, what, kRecordFormat, kResidencyFormat));
  Reader rd(v);
  uint8_t fmt, state;
  bool ok = rd.Get(&fmt) && rd.Get(&state) && rd.Get(&r->file_bytes) &&
            rd.GetBytes(&r->tier, kMaxTierNameBytes) && rd.GetBytes(&r->path, kMaxPathBytes);
  if (ok && fmt >= 2) {
    ok = rd.Get(&r->ram_generation) && rd.Get(&r->ram_index_offset) && rd.Get(&r->ram_index_bytes);
  }
  if (!ok || rd.pos() + 8 != v.size()) {
    return Status::Corrupt("catalog record " + what + " has the wrong length");
  }
  if (!ValidResidency(state)) {
    return Status::Corrupt("catalog record " + what + " has unknown residency state " +
                           std::to_string(state));
  }
  r->state = state;
  return Status::Ok();
}

void VersionStatsRecord::AddTier(const std::string& name, uint64_t bytes, uint64_t ns) {
  for (Tier& t : tiers) {
    if (t.name == name) {
      t.bytes_written += bytes;
      t.write_ns += ns;
      return;
    }
  }
  if (tiers.size() == CKPTDB_MAX_TIERS) tiers.erase(tiers.begin());
  tiers.push_back({name, bytes, ns});
}

std::string Catalog::EncodeStats(const VersionStatsRecord& r) {
  Writer w;
  w.Put<uint8_t>(kRecordFormat);
  for (uint64_t f :
       {r.bytes, r.put_calls, r.put_blocked_ns, r.wait_capture_blocked_ns, r.commit_blocked_ns,
        r.capture_ns, r.commit_ns, r.backpressure_waits, r.backpressure_wait_ns, r.direct_chunks,
        r.staging_high_water_bytes, r.fsyncs}) {
    w.Put(f);
  }
  w.Put<uint32_t>(static_cast<uint32_t>(r.tiers.size()));
  for (const VersionStatsRecord::Tier& t : r.tiers) {
    w.PutBytes(t.name);
    w.Put(t.bytes_written);
    w.Put(t.write_ns);
  }
  return w.Finish();
}

Status Catalog::DecodeStats(const std::string& v, const std::string& what, VersionStatsRecord* r) {
  CKPTDB_RETURN_IF_ERROR(CheckFrame(v, what));
  Reader rd(v);
  uint8_t fmt;
  uint32_t tiers = 0;
  bool ok = rd.Get(&fmt);
  for (uint64_t* f :
       {&r->bytes, &r->put_calls, &r->put_blocked_ns, &r->wait_capture_blocked_ns,
        &r->commit_blocked_ns, &r->capture_ns, &r->commit_ns, &r->backpressure_waits,
        &r->backpressure_wait_ns, &r->direct_chunks, &r->staging_high_water_bytes, &r->fsyncs}) {
    ok = ok && rd.Get(f);
  }
  ok = ok && rd.Get(&tiers) && tiers <= CKPTDB_MAX_TIERS;
  r->tiers.clear();
  for (uint32_t i = 0; ok && i < tiers; ++i) {
    VersionStatsRecord::Tier t;
    ok = rd.GetBytes(&t.name, kMaxTierNameBytes) && rd.Get(&t.bytes_written) && rd.Get(&t.write_ns);
    r->tiers.push_back(std::move(t));
  }
  if (!ok || rd.pos() + 8 != v.size()) {
    return Status::Corrupt("catalog record " + what + " has the wrong length");
  }
  return Status::Ok();
}

}  // namespace ckpt::engine
