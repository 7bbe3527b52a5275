#include "tools/safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "ckptdb/ckptdb.h"
#include "util/text.h"

namespace ckpt::tools {
namespace {

// Its own table of sizes (not ckptdb_dtype_bytes), so that the fuzz target needs no engine.
struct DtypeName {
  int dtype;
  const char* name;
  uint64_t bytes;
};
constexpr DtypeName kDtypes[] = {
    {CKPTDB_DTYPE_BOOL, "BOOL", 1},       {CKPTDB_DTYPE_U8, "U8", 1},
    {CKPTDB_DTYPE_I8, "I8", 1},           {CKPTDB_DTYPE_U16, "U16", 2},
    {CKPTDB_DTYPE_I16, "I16", 2},         {CKPTDB_DTYPE_U32, "U32", 4},
    {CKPTDB_DTYPE_I32, "I32", 4},         {CKPTDB_DTYPE_U64, "U64", 8},
    {CKPTDB_DTYPE_I64, "I64", 8},         {CKPTDB_DTYPE_F16, "F16", 2},
    {CKPTDB_DTYPE_BF16, "BF16", 2},       {CKPTDB_DTYPE_F32, "F32", 4},
    {CKPTDB_DTYPE_F64, "F64", 8},         {CKPTDB_DTYPE_F8_E4M3, "F8_E4M3", 1},
    {CKPTDB_DTYPE_F8_E5M2, "F8_E5M2", 1},
};

bool Unsigned(const nlohmann::json& j, uint64_t* out) {
  if (!j.is_number_unsigned()) return false;
  *out = j.get<uint64_t>();
  return true;
}

// Text from the file, for an error message: escaped, at most 200 bytes of it (util/text.h).
std::string Shown(const std::string& text) { return ShowText(text); }

}  // namespace

std::string DescribeJson(const nlohmann::json& j) {
  if (j.is_string()) return "\"" + Shown(j.get<std::string>()) + "\"";
  if (j.is_number_unsigned()) return std::to_string(j.get<uint64_t>());
  if (j.is_array()) {
    std::string out = "[";
    for (const nlohmann::json& e : j) {
      if (out.size() > 200) return out + "...]";
      out += (out.size() > 1 ? ", " : "") +
             (e.is_number_unsigned()  ? std::to_string(e.get<uint64_t>())
              : e.is_number_integer() ? std::to_string(e.get<int64_t>())
                                      : std::string("a ") + e.type_name());
    }
    return out + "]";
  }
  return std::string("a ") + j.type_name();
}

bool ParseShallowJson(const char* begin, const char* end, int max_depth, nlohmann::json* out) {
  bool too_deep = false;
  nlohmann::json::parser_callback_t check = [&](int depth, nlohmann::json::parse_event_t,
                                                nlohmann::json&) {
    if (depth > max_depth) too_deep = true;
    return depth <= max_depth;
  };
  nlohmann::json j = nlohmann::json::parse(begin, end, check, false);
  if (too_deep || j.is_discarded()) return false;
  *out = std::move(j);
  return true;
}

const char* SafetensorsDtype(int dtype) {
  for (const DtypeName& d : kDtypes) {
    if (d.dtype == dtype) return d.name;
  }
  return "";
}

Status ParseSafetensors(const uint8_t* data, uint64_t available, uint64_t file_bytes,
                        const std::string& what, SafetensorsFile* out) {
  if (available < 8 || file_bytes < 8) {
    return Status::Invalid(what + ": " + std::to_string(file_bytes) +
                           " bytes, shorter than a safetensors header's 8-byte length");
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  if (n > kSafetensorsMaxHeader) {
    return Status::Invalid(what + ": the header claims " + std::to_string(n) +
                           " bytes, more than safetensors' limit of 100 MB");
  }
  if (n > file_bytes - 8 || n > available - 8) {
    return Status::Invalid(what + ": the header claims " + std::to_string(n) +
                           " bytes, the file has " + std::to_string(file_bytes - 8) +
                           " after the length");
  }
  const char* text = reinterpret_cast<const char*>(data + 8);
  if (n == 0 || text[0] != '{') {
    return Status::Invalid(what + ": the header does not start with '{'");
  }
  // A header nests 3 levels (tensor, entry, shape): deeper is refused while parsing.
  nlohmann::json header;
  if (!ParseShallowJson(text, text + n, 4, &header) || !header.is_object()) {
    return Status::Invalid(what + ": the header is not a JSON object of safetensors' shape");
  }
  SafetensorsFile f;
  f.buffer_offset = 8 + n;
  const uint64_t buffer_bytes = file_bytes - f.buffer_offset;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return Status::Invalid(what + ": __metadata__ is not an object");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) {
          return Status::Invalid(what + ": __metadata__ '" + Shown(key) + "' is not a string");
        }
        f.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    const std::string at = what + ": tensor '" + Shown(name) + "'";
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets") || entry.size() != 3) {
      return Status::Invalid(at + " is not {\"dtype\", \"shape\", \"data_offsets\"}");
    }
    SafetensorsTensor t;
    t.name = name;
    const nlohmann::json& dtype = entry["dtype"];
    uint64_t element = 0;
    for (const DtypeName& d : kDtypes) {
      if (dtype.is_string() && dtype.get<std::string>() == d.name) {
        t.dtype = d.dtype;
        element = d.bytes;
      }
    }
    if (t.dtype == 0) return Status::Invalid(at + " has an unknown dtype " + DescribeJson(dtype));
    const nlohmann::json& shape = entry["shape"];
    if (!shape.is_array() || shape.size() > CKPTDB_MAX_DIMS) {
      return Status::Invalid(at + ": shape is not an array of at most " +
                             std::to_string(CKPTDB_MAX_DIMS) + " dimensions");
    }
    uint64_t elements = 1;
    bool overflow = false;
    for (const nlohmann::json& d : shape) {
      uint64_t v = 0;
      if (!Unsigned(d, &v))
        return Status::Invalid(at + ": shape " + DescribeJson(shape) + " is not unsigned");
      t.shape.push_back(v);
      if (v != 0 && elements > UINT64_MAX / v) overflow = true;
      elements = overflow ? elements : elements * v;
    }
    const nlohmann::json& offsets = entry["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !Unsigned(offsets[0], &t.begin) ||
        !Unsigned(offsets[1], &t.end) || t.end < t.begin) {
      return Status::Invalid(at + ": data_offsets " + DescribeJson(offsets) +
                             " is not [begin, end]");
    }
    const bool too_big = overflow || elements > UINT64_MAX / element;
    if (too_big || elements * element != t.end - t.begin) {
      // Both sizes said as they are: a shape too big for 64 bits is not "0 bytes".
      return Status::Invalid(at + ": shape " + DescribeJson(shape) + " of " +
                             Shown(dtype.get<std::string>()) + " is " +
                             (too_big ? std::string("2^64 bytes or more")
                                      : std::to_string(elements * element) + " bytes") +
                             ", its data_offsets " + std::to_string(t.end - t.begin) + " bytes");
    }
    f.tensors.push_back(std::move(t));
  }
  // The byte ranges tile the buffer: no overlap, no hole, nothing after.
  std::vector<const SafetensorsTensor*> by_offset;
  for (const SafetensorsTensor& t : f.tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const auto* a, const auto* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t next = 0;
  for (const SafetensorsTensor* t : by_offset) {
    if (t->begin != next) {
      return Status::Invalid(what + ": tensor '" + Shown(t->name) + "' starts at byte " +
                             std::to_string(t->begin) + " of the buffer, not " +
                             std::to_string(next) +
                             (t->begin < next ? " (an overlap)" : " (a hole)"));
    }
    next = t->end;
  }
  if (next != buffer_bytes) {
    return Status::Invalid(what + ": the tensors fill " + std::to_string(next) + " bytes of a " +
                           std::to_string(buffer_bytes) + "-byte buffer");
  }
  *out = std::move(f);
  return Status::Ok();
}

Status BuildSafetensorsHeader(const std::vector<SafetensorsTensor>& tensors,
                              const std::map<std::string, std::string>& metadata,
                              std::string* out) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  for (const SafetensorsTensor& t : tensors) {
    header[t.name] = {{"dtype", SafetensorsDtype(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {t.begin, t.end}}};
  }
  std::string json;
  try {
    json = header.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::strict);
  } catch (const nlohmann::json::exception& e) {
    return Status::Invalid(std::string("a tensor name or metadata is not UTF-8: ") + e.what());
  }
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string length(8, '\0');
  for (int i = 0; i < 8; ++i) length[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
  *out = length + json;
  return Status::Ok();
}

}  // namespace ckpt::tools
