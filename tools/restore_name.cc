// The file name `ckptdb restore` gives a tensor (tools/commands.h). Tensor names come from the
// store and are not trusted: fuzz/fuzz_restore_name.cc holds this function to its promises.
#include <cinttypes>
#include <cstdio>
#include <string>

#include "format/checksum.h"
#include "tools/commands.h"

namespace ckpt::tools {
namespace {

constexpr size_t kMaxFileNameBytes = 255;  // NAME_MAX on Linux file systems
constexpr size_t kKeptPrefixBytes = 200;   // of a shortened name, before "~<hash>.bin"

bool IsSafeByte(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

}  // namespace

// The file name tensor `name` is restored to: one path component, never "." or "..", at most
// NAME_MAX bytes, and distinct for distinct names (percent-encoding is injective; a shortened
// name carries the xxh3 of the whole name).
std::string RestoreFileName(const std::string& name) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string encoded;
  for (unsigned char c : name) {
    if (IsSafeByte(c)) {
      encoded += static_cast<char>(c);
    } else {
      encoded += '%';
      encoded += kHex[c >> 4];
      encoded += kHex[c & 15];
    }
  }
  if (encoded.size() + 4 <= kMaxFileNameBytes) return encoded + ".bin";
  size_t keep = kKeptPrefixBytes;
  // Do not cut a %XX escape in two.
  if (encoded[keep - 1] == '%') keep -= 1;
  if (encoded[keep - 2] == '%') keep -= 2;
  char hash[20];
  std::snprintf(hash, sizeof hash, "~%016" PRIx64, format::Xxh3(name.data(), name.size()));
  return encoded.substr(0, keep) + hash + ".bin";
}

}  // namespace ckpt::tools
