// The safetensors file format (https://github.com/huggingface/safetensors, "Format"), for
// `ckptdb export` and `ckptdb import` (docs/cli.md):
//
//   8 bytes    N, the header's length, unsigned little-endian
//   N bytes    a JSON object, UTF-8, maybe padded with spaces: for each tensor name
//              {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, and optionally
//              "__metadata__": {string: string}
//   the rest   the byte buffer: each tensor's elements, row-major and little-endian, at
//              [begin, end) of the buffer
//
// A file is read as untrusted: the parser refuses, naming what is wrong, a header longer than
// 100 MB or than the file, JSON that is not such an object, an unknown dtype, a shape whose
// size overflows or does not match its byte range, and byte ranges that overlap, leave a hole,
// or do not end at the file's end (as the reference implementation does).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "util/status.h"

namespace ckpt::tools {

struct SafetensorsTensor {
  std::string name;
  int dtype = 0;  // a ckptdb_dtype other than UNKNOWN
  std::vector<uint64_t> shape;
  uint64_t begin = 0;  // the byte range in the buffer
  uint64_t end = 0;
};

struct SafetensorsFile {
  std::vector<SafetensorsTensor> tensors;  // in name order
  std::map<std::string, std::string> metadata;
  uint64_t buffer_offset = 0;  // where the byte buffer starts in the file: 8 + N
};

inline constexpr uint64_t kSafetensorsMaxHeader = 100'000'000;

// Parses the first `available` bytes of a file of `file_bytes` (at least the 8-byte length and
// the header). `what` names the file in errors.
Status ParseSafetensors(const uint8_t* data, uint64_t available, uint64_t file_bytes,
                        const std::string& what, SafetensorsFile* out);

// The 8-byte length and the JSON header for `tensors` (their begin/end set by the caller, in
// order), padded with spaces so that the buffer starts 8-byte aligned. Fails for a name or
// metadata that is not UTF-8 (JSON cannot carry it unchanged).
Status BuildSafetensorsHeader(const std::vector<SafetensorsTensor>& tensors,
                              const std::map<std::string, std::string>& metadata, std::string* out);

// Parses untrusted JSON text (a header, or a metadata value holding JSON), refusing nesting
// deeper than max_depth while parsing (which does not recurse). False for anything refused.
bool ParseShallowJson(const char* begin, const char* end, int max_depth, nlohmann::json* out);

// A value from an untrusted file, for an error message: strings and numbers shown (the first
// 200 bytes), anything else named by its type (dump() recurses once per level of nesting).
std::string DescribeJson(const nlohmann::json& j);

// "F32" for CKPTDB_DTYPE_F32, ...; "" for UNKNOWN or a value out of range.
const char* SafetensorsDtype(int dtype);

}  // namespace ckpt::tools
