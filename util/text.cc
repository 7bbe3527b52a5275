#include "util/text.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>

namespace ckpt {
namespace {

// The length of the valid UTF-8 sequence at text[i] (1..4) and its code point, or 0 when the
// byte there starts none (a stray continuation, an overlong form, a surrogate, past U+10FFFF, or
// cut short).
size_t Utf8At(std::string_view text, size_t i, uint32_t* cp) {
  const auto b0 = static_cast<uint8_t>(text[i]);
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  size_t n = 0;
  uint32_t min = 0;
  if ((b0 & 0xE0) == 0xC0) {
    n = 2, *cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 3, *cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 4, *cp = b0 & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (i + n > text.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    const auto b = static_cast<uint8_t>(text[i + k]);
    if ((b & 0xC0) != 0x80) return 0;
    *cp = (*cp << 6) | (b & 0x3F);
  }
  if (*cp < min || *cp > 0x10FFFF || (*cp >= 0xD800 && *cp <= 0xDFFF)) return 0;
  return n;
}

// C1 controls; the bidirectional controls that reorder a line (U+061C, U+200E, U+200F,
// U+202A-U+202E, U+2066-U+2069); the line and paragraph separators some viewers break lines at
// (U+2028, U+2029); and the invisible ones a name could hide behind (U+200B-U+200D, U+2060,
// U+FEFF).
bool Reorders(uint32_t cp) {
  return (cp >= 0x80 && cp <= 0x9F) || cp == 0x061C || (cp >= 0x200B && cp <= 0x200F) ||
         (cp >= 0x2028 && cp <= 0x202E) || cp == 0x2060 || (cp >= 0x2066 && cp <= 0x2069) ||
         cp == 0xFEFF;
}

std::string Hex(uint8_t b) {
  char out[8];
  std::snprintf(out, sizeof out, "\\x%02x", b);
  return out;
}

std::string Escape(std::string_view text, size_t max_bytes, char quote, bool keep_backslash) {
  std::string out;
  out.reserve(std::min(text.size(), max_bytes) + 16);
  size_t i = 0;
  for (; i < text.size();) {
    std::string piece;
    uint32_t cp = 0;
    const size_t n = Utf8At(text, i, &cp);
    const auto b = static_cast<uint8_t>(text[i]);
    if (n == 0 || (n == 1 && (b < 0x20 || b == 0x7F))) {
      piece = Hex(b);
    } else if (n == 1 && b == '\\' && !keep_backslash) {
      piece = "\\\\";
    } else if (n == 1 && quote != 0 && b == static_cast<uint8_t>(quote)) {
      piece = std::string("\\") + quote;
    } else if (Reorders(cp)) {
      char u[16];
      std::snprintf(u, sizeof u, "\\u{%04X}", static_cast<unsigned>(cp));
      piece = u;
    } else {
      piece.assign(text.substr(i, n));
    }
    if (out.size() + piece.size() > max_bytes) break;
    out += piece;
    i += n == 0 ? 1 : n;
  }
  if (i < text.size()) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

}  // namespace

std::string ShowText(std::string_view text, size_t max_bytes, char quote) {
  return Escape(text, max_bytes, quote, /*keep_backslash=*/false);
}

std::string QuoteName(std::string_view name) {
  return "'" + ShowText(name, kMaxShownBytes, '\'') + "'";
}

std::string SafeMessage(std::string_view message, size_t max_bytes) {
  return Escape(message, max_bytes, 0, /*keep_backslash=*/true);
}

std::string JsonForTerminal(std::string_view json) {
  std::string out;
  out.reserve(json.size());
  // Bounded: each step consumes at least one byte.
  for (size_t i = 0; i < json.size();) {
    uint32_t cp = 0;
    const size_t n = Utf8At(json, i, &cp);
    if (n > 0 && (cp == 0x7F || Reorders(cp))) {
      char u[8];
      std::snprintf(u, sizeof u, "\\u%04x", static_cast<unsigned>(cp));
      out += u;
    } else {
      out.append(json.substr(i, n == 0 ? 1 : n));
    }
    i += n == 0 ? 1 : n;
  }
  return out;
}

}  // namespace ckpt
