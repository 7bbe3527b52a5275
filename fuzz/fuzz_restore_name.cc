// libFuzzer target for the CLI's restore path (tools/restore_name.cc): the file name `ckptdb
// restore` writes a tensor to, from a name the store holds and nothing vouches for. Any bytes,
// cut at their first NUL into two names (tensor names hold no NUL). Each file name must be one
// path component of at most NAME_MAX bytes that is neither "." nor "..", made of
// [A-Za-z0-9._-], whole %XX escapes and a "~<hash>" of a shortened name, ending in ".bin"; a
// name short enough to be kept whole must decode back from it; two different names must get
// different files.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "tools/commands.h"

namespace {

bool Safe(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

int Hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Checks the file name of `name`; returns it.
std::string Check(const std::string& name) {
  const std::string file = ckpt::tools::RestoreFileName(name);
  if (file.empty() || file.size() > 255 || file == "." || file == ".." || file.size() < 4 ||
      file.compare(file.size() - 4, 4, ".bin") != 0) {
    std::abort();
  }
  const std::string stem = file.substr(0, file.size() - 4);
  std::string decoded;
  bool shortened = false;
  for (size_t i = 0; i < stem.size(); ++i) {
    const char c = stem[i];
    if (Safe(c)) {
      decoded += c;
    } else if (c == '%') {
      if (i + 2 >= stem.size()) std::abort();  // an escape cut short
      const int hi = Hex(stem[i + 1]), lo = Hex(stem[i + 2]);
      if (hi < 0 || lo < 0) std::abort();
      decoded += static_cast<char>(hi * 16 + lo);
      i += 2;
    } else if (c == '~' && !shortened && stem.size() - i == 17) {
      for (size_t j = i + 1; j < stem.size(); ++j) {
        if (!((stem[j] >= '0' && stem[j] <= '9') || (stem[j] >= 'a' && stem[j] <= 'f'))) {
          std::abort();
        }
      }
      shortened = true;
      break;
    } else {
      std::abort();  // '/', NUL, a control byte, anything unescaped
    }
  }
  if (!shortened && decoded != name) std::abort();
  if (shortened && name.compare(0, decoded.size(), decoded) != 0) std::abort();
  return file;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string a = in.substr(0, nul);
  const std::string b = nul == std::string::npos ? "" : in.substr(nul + 1);
  if (a.empty() || a.size() > 1024) return 0;  // a name the store can hold
  const std::string fa = Check(a);
  if (b.empty() || b.size() > 1024 || b.find('\0') != std::string::npos || b == a) return 0;
  if (Check(b) == fa) std::abort();
  return 0;
}
