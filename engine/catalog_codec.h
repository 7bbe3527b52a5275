// The catalog's record codec, shared by catalog.cc (RocksDB) and catalog_records.cc (the
// records, without RocksDB: what fuzz_catalog_record fuzzes). docs/format.md, "Catalog".
// Not part of any interface.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "ckptdb/ckptdb.h"
#include "format/checksum.h"
#include "util/status.h"

namespace ckpt::engine::catalog_codec {

inline constexpr uint8_t kRecordFormat = 1;
// Residency records of format 2 add the ram tier's locator (generation, index offset and size);
// format 1 records (written before the ram tier existed) are still read.
inline constexpr uint8_t kResidencyFormat = 2;
inline constexpr size_t kMaxPathBytes = 4096;
inline constexpr size_t kMaxTierNameBytes = 4096 + 16;

// Appends and reads little-endian fields; Reader refuses to run past the end.
class Writer {
 public:
  template <typename T>
  void Put(T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    s_.append(b, sizeof(T));
  }
  void PutBytes(const std::string& v) {
    Put<uint32_t>(static_cast<uint32_t>(v.size()));
    s_.append(v);
  }
  std::string Finish() {
    Put<uint64_t>(format::Xxh3(s_.data(), s_.size()));
    return std::move(s_);
  }

 private:
  std::string s_;
};

class Reader {
 public:
  explicit Reader(const std::string& s) : s_(s) {}
  template <typename T>
  bool Get(T* v) {
    if (s_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(v, s_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool GetBytes(std::string* v, size_t max_bytes) {
    uint32_t n;
    if (!Get(&n) || n > max_bytes || s_.size() - pos_ < n) return false;
    v->assign(s_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  size_t pos() const { return pos_; }

 private:
  const std::string& s_;
  size_t pos_ = 0;
};

// Checks the trailing xxh3 and the record format byte (one of [min_format, max_format]).
Status CheckFrame(const std::string& v, const std::string& what, uint8_t min_format = kRecordFormat,
                  uint8_t max_format = kRecordFormat);

inline std::string Be64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (56 - 8 * i));
  return s;
}
inline uint64_t FromBe64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

inline std::string VersionKey(uint64_t v) { return "v/" + Be64(v); }
inline std::string ResidencyPrefix(uint64_t v) { return "r/" + Be64(v) + "/"; }
inline std::string StatsKey(uint64_t v) { return "s/" + Be64(v); }

inline bool ValidState(int s) { return s >= CKPTDB_STATE_OPEN && s <= CKPTDB_STATE_RETIRED; }
inline bool ValidResidency(int s) {
  return s >= CKPTDB_RESIDENT_WRITING && s <= CKPTDB_RESIDENT_EVICTED;
}

}  // namespace ckpt::engine::catalog_codec
