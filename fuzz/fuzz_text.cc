// libFuzzer target for util/text.h: how a name, a path or a file's bytes are shown on a terminal
// and in messages. Any bytes, shown with a bound taken from the first byte. Checked: nothing shown
// holds a control byte, invalid UTF-8, a C1 or a bidirectional control; it is no longer than its
// bound plus the cut's note; a text shown whole reads back (unescaped) to exactly the input, and
// a cut one to a prefix of it followed by "... (N bytes)", N the input's length; a quoted name
// holds no bare quote; a message keeps within its bound the same way.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "util/text.h"

namespace {

[[noreturn]] void Fail() { std::abort(); }

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xC0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xE0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    *out += static_cast<char>(0xF0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Every byte valid UTF-8, none a control byte or a C1 / bidirectional control.
void CheckSafe(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<uint8_t>(s[i]);
    if (b < 0x20 || b == 0x7F) Fail();
    size_t n = b < 0x80             ? 1
               : (b & 0xE0) == 0xC0 ? 2
               : (b & 0xF0) == 0xE0 ? 3
               : (b & 0xF8) == 0xF0 ? 4
                                    : 0;
    if (n == 0 || i + n > s.size()) Fail();
    uint32_t cp = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
    for (size_t k = 1; k < n; ++k) {
      const auto c = static_cast<uint8_t>(s[i + k]);
      if ((c & 0xC0) != 0x80) Fail();
      cp = (cp << 6) | (c & 0x3F);
    }
    const uint32_t min = n == 1 ? 0 : n == 2 ? 0x80 : n == 3 ? 0x800 : 0x10000;
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) Fail();
    if ((cp >= 0x80 && cp <= 0x9F) || cp == 0x061C || (cp >= 0x200B && cp <= 0x200F) ||
        (cp >= 0x2028 && cp <= 0x202E) || cp == 0x2060 || (cp >= 0x2066 && cp <= 0x2069) ||
        cp == 0xFEFF) {
      Fail();
    }
    i += n;
  }
}

// ShowText's escapes undone; Fail on one that is malformed.
std::string Unescape(std::string_view s, char quote) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\') {
      if (quote != 0 && s[i] == quote) Fail();  // a bare quote inside a quoted name
      out += s[i];
      continue;
    }
    if (i + 1 >= s.size()) Fail();
    const char e = s[++i];
    if (e == '\\' || (quote != 0 && e == quote)) {
      out += e;
    } else if (e == 'x') {
      if (i + 2 >= s.size()) Fail();
      const int hi = HexDigit(s[i + 1]), lo = HexDigit(s[i + 2]);
      if (hi < 0 || lo < 0) Fail();
      out += static_cast<char>(hi * 16 + lo);
      i += 2;
    } else if (e == 'u') {
      if (i + 1 >= s.size() || s[i + 1] != '{') Fail();
      const size_t close = s.find('}', i);
      if (close == std::string_view::npos || close - i < 3 || close - i > 8) Fail();
      uint32_t cp = 0;
      for (size_t k = i + 2; k < close; ++k) {
        const int d = HexDigit(s[k]);
        if (d < 0) Fail();
        cp = cp * 16 + static_cast<uint32_t>(d);
      }
      AppendUtf8(cp, &out);
      i = close;
    } else {
      Fail();
    }
  }
  return out;
}

void CheckShown(std::string_view input, const std::string& shown, size_t max, char quote) {
  CheckSafe(shown);
  const std::string note = "... (" + std::to_string(input.size()) + " bytes)";
  const bool cut =
      shown.size() >= note.size() &&
      shown.compare(shown.size() - note.size(), note.size(), note) == 0 &&
      Unescape(std::string_view(shown).substr(0, shown.size() - note.size()), quote).size() <
          input.size();
  const std::string_view body =
      cut ? std::string_view(shown).substr(0, shown.size() - note.size()) : shown;
  if (body.size() > max) Fail();
  const std::string back = Unescape(body, quote);
  if (cut) {
    if (input.substr(0, back.size()) != back) Fail();
  } else if (back != input) {
    Fail();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t max = 8 + data[0] % 250;
  const std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);
  CheckShown(input, ckpt::ShowText(input, max), max, 0);
  const std::string quoted = ckpt::QuoteName(input);
  if (quoted.size() < 2 || quoted.front() != '\'' || quoted.back() != '\'') Fail();
  CheckShown(input, quoted.substr(1, quoted.size() - 2), ckpt::kMaxShownBytes, '\'');
  const std::string message = ckpt::SafeMessage(input, max);
  CheckSafe(message);
  if (message.size() > max + 32) Fail();
  return 0;
}
