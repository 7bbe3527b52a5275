#include "redundancy/erasure_code.h"

#include <isa-l/erasure_code.h>
#include <isa-l/raid.h>

#include <algorithm>
#include <cstring>

#include "util/assert.h"

namespace ckpt::redundancy {

// dst ^= src; the compiler vectorizes it, and it runs at memory speed like xor_gen, which needs
// 32-byte aligned blocks that pieces of a segment image need not be.
void XorInto(uint8_t* dst, const uint8_t* src, size_t bytes) {
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t a, b;
    std::memcpy(&a, dst + i, 8);
    std::memcpy(&b, src + i, 8);
    a ^= b;
    std::memcpy(dst + i, &a, 8);
  }
  for (; i < bytes; ++i) dst[i] ^= src[i];
}

namespace {

bool Aligned32(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 31) == 0; }

bool ParseCount(const std::string& text, uint32_t* out) {
  if (text.empty() || text.size() > 2 ||
      !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return false;
  }
  *out = static_cast<uint32_t>(std::stoul(text));
  return true;
}

// ISA-L's length arguments are int: blocks are processed in slices it can take.
constexpr size_t kMaxSliceBytes = size_t{1} << 30;

}  // namespace

std::string CodeSpec::Name() const {
  return scheme == CodeScheme::kXor ? "xor:" + std::to_string(k)
                                    : "ec:" + std::to_string(k) + "+" + std::to_string(m);
}

std::string CodeSpec::Spelling() const {
  return encoding == Encoding::kSender ? Name() + ",encode=sender" : Name();
}

Status ParseCodeSpec(const std::string& text, CodeSpec* out) {
  CodeSpec spec;
  if (text.rfind("xor:", 0) == 0) {
    spec.scheme = CodeScheme::kXor;
    spec.m = 1;
    if (text.find(',') != std::string::npos) {
      return Status::Invalid("redundancy '" + text + "': xor:K takes no options (XOR has no " +
                             "multiply to place: a partial is the unit itself)");
    }
    if (ParseCount(text.substr(4), &spec.k) && spec.k >= 2 && spec.k + 1 <= kMaxCodeBlocks) {
      *out = spec;
      return Status::Ok();
    }
    return Status::Invalid("redundancy '" + text + "': xor:K needs K in 2.." +
                           std::to_string(kMaxCodeBlocks - 1) +
                           " (K data blocks and their XOR on K + 1 distinct nodes)");
  }
  if (text.rfind("ec:", 0) == 0) {
    std::string rest = text.substr(3);
    if (const size_t comma = rest.find(','); comma != std::string::npos) {
      const std::string option = rest.substr(comma + 1);
      rest.resize(comma);
      if (option == "encode=sender") {
        spec.encoding = Encoding::kSender;
      } else if (option != "encode=holder") {
        return Status::Invalid("redundancy '" + text + "': after ec:K+M only ,encode=holder or " +
                               ",encode=sender (where the coefficients multiply)");
      }
    }
    const size_t plus = rest.find('+');
    if (plus != std::string::npos && ParseCount(rest.substr(0, plus), &spec.k) &&
        ParseCount(rest.substr(plus + 1), &spec.m) && spec.k >= 1 && spec.m >= 1 &&
        spec.k + spec.m <= kMaxCodeBlocks) {
      *out = spec;
      return Status::Ok();
    }
    return Status::Invalid("redundancy '" + text + "': ec:K+M needs K >= 1, M >= 1 and K + M <= " +
                           std::to_string(kMaxCodeBlocks) +
                           " (K data and M parity blocks on K + M distinct nodes)");
  }
  return Status::Invalid("redundancy '" + text +
                         "': expected ec:K+M[,encode=holder|sender] or xor:K");
}

Status ErasureCode::Make(const CodeSpec& spec, std::unique_ptr<ErasureCode>* out) {
  if (spec.k < 1 || spec.m < 1 || spec.k + spec.m > kMaxCodeBlocks ||
      (spec.scheme == CodeScheme::kXor && (spec.m != 1 || spec.k < 2))) {
    return Status::Invalid("erasure code " + spec.Name() + ": out of range");
  }
  std::unique_ptr<ErasureCode> code(new ErasureCode(spec));
  const uint32_t k = spec.k, rows = spec.k + spec.m;
  code->matrix_.assign(size_t{rows} * k, 0);
  if (spec.scheme == CodeScheme::kXor) {
    for (uint32_t i = 0; i < k; ++i) code->matrix_[size_t{i} * k + i] = 1;
    for (uint32_t j = 0; j < k; ++j) code->matrix_[size_t{k} * k + j] = 1;
  } else {
    gf_gen_cauchy1_matrix(code->matrix_.data(), static_cast<int>(rows), static_cast<int>(k));
  }
  code->tables_.assign(size_t{32} * k * spec.m, 0);
  ec_init_tables(static_cast<int>(k), static_cast<int>(spec.m), &code->matrix_[size_t{k} * k],
                 code->tables_.data());
  std::vector<uint32_t> all_rows(spec.m);
  for (uint32_t r = 0; r < spec.m; ++r) all_rows[r] = r;
  for (uint32_t j = 0; j < k; ++j) {
    const std::vector<uint8_t> column = code->TablesOf(all_rows, j, 1);
    code->column_tables_.insert(code->column_tables_.end(), column.begin(), column.end());
  }
  *out = std::move(code);
  return Status::Ok();
}

uint8_t ErasureCode::Coefficient(uint32_t row, uint32_t data_index) const {
  CKPTDB_ASSERT(row < spec_.m && data_index < spec_.k);
  return matrix_[size_t{spec_.k + row} * spec_.k + data_index];
}

void ErasureCode::Encode(size_t bytes, const uint8_t* const* data, uint8_t* const* parity) const {
  const uint32_t k = spec_.k;
  for (size_t off = 0; off < bytes; off += kMaxSliceBytes) {
    const size_t n = std::min(kMaxSliceBytes, bytes - off);
    std::vector<uint8_t*> src(k);
    for (uint32_t i = 0; i < k; ++i) src[i] = const_cast<uint8_t*>(data[i]) + off;
    if (spec_.scheme == CodeScheme::kXor) {
      bool aligned = Aligned32(parity[0] + off);
      for (uint8_t* p : src) aligned = aligned && Aligned32(p);
      if (aligned) {
        std::vector<void*> vects(src.begin(), src.end());
        vects.push_back(parity[0] + off);
        int rc = xor_gen(static_cast<int>(k + 1), static_cast<int>(n), vects.data());
        CKPTDB_ASSERT(rc == 0);
      } else {
        std::memcpy(parity[0] + off, src[0], n);
        for (uint32_t i = 1; i < k; ++i) XorInto(parity[0] + off, src[i], n);
      }
      continue;
    }
    std::vector<uint8_t*> dst(spec_.m);
    for (uint32_t r = 0; r < spec_.m; ++r) dst[r] = parity[r] + off;
    ec_encode_data(static_cast<int>(n), static_cast<int>(k), static_cast<int>(spec_.m),
                   const_cast<uint8_t*>(tables_.data()), src.data(), dst.data());
  }
}

std::vector<uint8_t> ErasureCode::TablesOf(std::span<const uint32_t> rows, uint32_t first,
                                           uint32_t sources) const {
  const uint32_t k = spec_.k;
  CKPTDB_ASSERT(!rows.empty() && first + sources <= k);
  std::vector<uint8_t> coefficients;
  for (uint32_t r : rows) {
    CKPTDB_ASSERT(r < spec_.m);
    const uint8_t* row = &matrix_[size_t{k + r} * k + first];
    coefficients.insert(coefficients.end(), row, row + sources);
  }
  std::vector<uint8_t> tables(size_t{32} * sources * rows.size(), 0);
  ec_init_tables(static_cast<int>(sources), static_cast<int>(rows.size()), coefficients.data(),
                 tables.data());
  return tables;
}

bool ErasureCode::AllRows(std::span<const uint32_t> rows) const {
  if (rows.size() != spec_.m) return false;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] != i) return false;
  }
  return true;
}

void ErasureCode::Update(size_t bytes, uint32_t data_index, const uint8_t* data,
                         std::span<const uint32_t> rows, uint8_t* const* parity) const {
  CKPTDB_ASSERT(data_index < spec_.k && !rows.empty() && rows.size() <= spec_.m);
  if (spec_.scheme == CodeScheme::kXor) {
    for (size_t i = 0; i < rows.size(); ++i) XorInto(parity[i], data, bytes);
    return;
  }
  const uint32_t k = spec_.k;
  // Tables are never cut out of tables_: their layout is ISA-L's own (32 bytes an entry in 2.30,
  // 8 with GFNI in later versions). All M rows in order use tables_; any other set gets its own.
  std::vector<uint8_t> own;
  if (!AllRows(rows)) own = TablesOf(rows, 0, k);
  const uint8_t* tables = own.empty() ? tables_.data() : own.data();
  for (size_t off = 0; off < bytes; off += kMaxSliceBytes) {
    const size_t n = std::min(kMaxSliceBytes, bytes - off);
    std::vector<uint8_t*> dst(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) dst[i] = parity[i] + off;
    ec_encode_data_update(static_cast<int>(n), static_cast<int>(k), static_cast<int>(rows.size()),
                          static_cast<int>(data_index), const_cast<uint8_t*>(tables),
                          const_cast<uint8_t*>(data) + off, dst.data());
  }
}

void ErasureCode::Partial(size_t bytes, uint32_t data_index, const uint8_t* data,
                          std::span<const uint32_t> rows, uint8_t* const* out) const {
  CKPTDB_ASSERT(data_index < spec_.k && !rows.empty() && rows.size() <= spec_.m);
  if (spec_.scheme == CodeScheme::kXor) {
    for (size_t i = 0; i < rows.size(); ++i) std::memcpy(out[i], data, bytes);
    return;
  }
  // One source against the rows: its column's tables for all M rows in order, else its own.
  std::vector<uint8_t> own;
  if (!AllRows(rows)) own = TablesOf(rows, data_index, 1);
  const uint8_t* tables =
      own.empty() ? column_tables_.data() + size_t{32} * spec_.m * data_index : own.data();
  for (size_t off = 0; off < bytes; off += kMaxSliceBytes) {
    const size_t n = std::min(kMaxSliceBytes, bytes - off);
    std::vector<uint8_t*> dst(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) dst[i] = out[i] + off;
    uint8_t* src = const_cast<uint8_t*>(data) + off;
    ec_encode_data(static_cast<int>(n), 1, static_cast<int>(rows.size()),
                   const_cast<uint8_t*>(tables), &src, dst.data());
  }
}

Status ErasureCode::Decode(size_t bytes, std::span<const uint32_t> present_index,
                           const uint8_t* const* present, std::span<const uint32_t> wanted,
                           uint8_t* const* out) const {
  const uint32_t k = spec_.k, total = spec_.k + spec_.m;
  if (present_index.size() != k) {
    return Status::Invalid("decoding " + spec_.Name() + ": " +
                           std::to_string(present_index.size()) + " blocks given, " +
                           std::to_string(k) + " needed");
  }
  std::vector<bool> seen(total, false);
  for (uint32_t i : present_index) {
    if (i >= total || seen[i]) {
      return Status::Invalid("decoding " + spec_.Name() + ": block index " + std::to_string(i) +
                             " repeated or out of range");
    }
    seen[i] = true;
  }
  for (uint32_t w : wanted) {
    if (w >= k) {
      return Status::Invalid("decoding " + spec_.Name() + ": data block " + std::to_string(w) +
                             " does not exist");
    }
  }
  if (wanted.empty()) return Status::Ok();
  if (spec_.scheme == CodeScheme::kXor) {
    // At most one data block is missing (K of K + 1 are present): it is the XOR of the others.
    for (size_t w = 0; w < wanted.size(); ++w) {
      auto at = std::find(present_index.begin(), present_index.end(), wanted[w]);
      if (at != present_index.end()) {
        std::memcpy(out[w], present[at - present_index.begin()], bytes);
        continue;
      }
      std::memcpy(out[w], present[0], bytes);
      for (uint32_t i = 1; i < k; ++i) XorInto(out[w], present[i], bytes);
    }
    return Status::Ok();
  }
  // The K x K rows of the generator for the blocks present, inverted: data = inverse x present.
  std::vector<uint8_t> sub(size_t{k} * k), inverse(size_t{k} * k);
  for (uint32_t r = 0; r < k; ++r) {
    std::memcpy(&sub[size_t{r} * k], &matrix_[size_t{present_index[r]} * k], k);
  }
  if (gf_invert_matrix(sub.data(), inverse.data(), static_cast<int>(k)) != 0) {
    return Status::Internal("decoding " + spec_.Name() + ": the survivors' matrix is singular");
  }
  std::vector<uint8_t> rows(wanted.size() * k);
  for (size_t w = 0; w < wanted.size(); ++w) {
    std::memcpy(&rows[w * k], &inverse[size_t{wanted[w]} * k], k);
  }
  std::vector<uint8_t> tables(size_t{32} * k * wanted.size());
  ec_init_tables(static_cast<int>(k), static_cast<int>(wanted.size()), rows.data(), tables.data());
  for (size_t off = 0; off < bytes; off += kMaxSliceBytes) {
    const size_t n = std::min(kMaxSliceBytes, bytes - off);
    std::vector<uint8_t*> src(k), dst(wanted.size());
    for (uint32_t i = 0; i < k; ++i) src[i] = const_cast<uint8_t*>(present[i]) + off;
    for (size_t w = 0; w < wanted.size(); ++w) dst[w] = out[w] + off;
    ec_encode_data(static_cast<int>(n), static_cast<int>(k), static_cast<int>(wanted.size()),
                   tables.data(), src.data(), dst.data());
  }
  return Status::Ok();
}

}  // namespace ckpt::redundancy
