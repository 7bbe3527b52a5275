// Tier spec parsing (io/tier_spec.h). Grammar, after trimming ASCII whitespace around every
// piece:
//   spec   := tier (';' tier)* [';']
//   tier   := ("tmpfs" | "disk") ':' PATH (',' option)*
//           | "ram" ':' SIZE (',' (option | "dir" '=' PATH | "replicas" '=' SIZE))*
//                                                   (first tier only)
//           | "nfs" ':' HOST ':' ABSPATH (',' (option | ("port" | "mountport") '=' PORT))*
//   HOST   := a name or IPv4 address ([A-Za-z0-9._-]+) | '[' an IPv6 address ']'
//   PORT   := decimal, 1 .. 65535
//   option := ("keep" | "every") '=' NUMBER        NUMBER := decimal digits, 1 .. 2^63
//   SIZE   := NUMBER ["K" | "M" | "G" | "T"]       (powers of 1024, 1M .. 1024T, rounded up
//                                                   to a multiple of 4096)
// The parser does no I/O: whether a path exists or is on the right kind of file system is
// checked when the tier is opened.
#include "io/tier_spec.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "io/nfs_path.h"

namespace ckpt::io {
namespace {

constexpr std::string_view kTierForm =
    "KIND:PATH[,keep=N][,every=N] with KIND one of tmpfs, disk, or "
    "ram:SIZE[,keep=N][,dir=PATH][,replicas=SIZE], or "
    "nfs:HOST:/PATH[,keep=N][,every=N][,port=N][,mountport=N]";
constexpr std::string_view kNfsArgForm =
    "HOST:/PATH after \"nfs:\", with HOST a name, an IPv4 address or an IPv6 address in "
    "brackets, and /PATH the absolute directory on the server";
// A DNS name is at most 253 bytes; an IPv6 address with a zone in brackets far less.
constexpr size_t kMaxHostBytes = 253;
constexpr std::string_view kRamSizeForm =
    "ram:SIZE with SIZE a decimal number of bytes, or with a K, M, G or T suffix (powers of "
    "1024), from 1M to 1024T";
constexpr uint64_t kMaxOptionValue = uint64_t{1} << 63;
// ckptdb_stats_t.tier_names holds 256 bytes per tier, NUL included: a longer name would reach
// the user cut off, and two tiers could look the same.
constexpr size_t kMaxNameBytes = 255;
// Longer specs are not typed by people; the bound keeps error messages and parsing small.
constexpr size_t kMaxSpecBytes = 64 * 1024;

bool IsAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// Why a directory path as written cannot name a tier ("" when it can): a control character (NUL
// included) has no place in one, and a spec formatted back (FormatTierSpec) must parse to the
// same path, which a path ending in whitespace would not (whitespace around a piece is trimmed).
std::string PathProblem(std::string_view text, const std::string& normal) {
  for (char c : text) {
    if (c == '\0') return "the path contains a NUL byte";
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return "the path contains a control character";
    }
  }
  if (!normal.empty() && IsAsciiSpace(normal.back())) return "the path ends in a space";
  return "";
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && IsAsciiSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsAsciiSpace(s.back())) s.remove_suffix(1);
  return s;
}

// Builds the one error form every malformed spec gets.
class ErrorFormatter {
 public:
  explicit ErrorFormatter(std::string_view spec) : spec_(spec) {}

  Status Invalid(size_t tier_number, std::string_view tier_text, const std::string& problem,
                 std::string_view expected) const {
    return Status::Invalid(Format(tier_number, tier_text, problem, expected));
  }

  std::string Format(size_t tier_number, std::string_view tier_text, const std::string& problem,
                     std::string_view expected) const {
    std::string m = "tier spec \"" + std::string(spec_) + "\": tier " +
                    std::to_string(tier_number) + " \"" + std::string(tier_text) + "\": " + problem;
    if (!expected.empty()) m += "; expected " + std::string(expected);
    return m;
  }

 private:
  std::string_view spec_;
};

// Parses NUMBER. Returns false with *problem set when text is not one.
bool ParseNumber(std::string_view text, uint64_t* value, std::string* problem) {
  if (text.empty()) {
    *problem = "empty value";
    return false;
  }
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') {
      *problem = "\"" + std::string(text) + "\" is not a plain decimal number";
      return false;
    }
    const auto digit = static_cast<uint64_t>(c - '0');
    // v * 10 + digit > kMaxOptionValue, without overflowing.
    if (v > (kMaxOptionValue - digit) / 10) {
      *problem = "\"" + std::string(text) + "\" is larger than 2^63";
      return false;
    }
    v = v * 10 + digit;
  }
  if (v == 0) {
    *problem = "\"" + std::string(text) + "\" is zero";
    return false;
  }
  *value = v;
  return true;
}

// True when `inner` is `outer` or lies below it. Both are absolute and lexically normal.
bool SameOrInside(const std::string& inner, const std::string& outer) {
  if (inner == outer) return true;
  if (outer == "/") return true;
  return inner.size() > outer.size() && inner.compare(0, outer.size(), outer) == 0 &&
         inner[outer.size()] == '/';
}

Status ResolveBase(const std::string& base_dir, std::filesystem::path* base) {
  if (!base_dir.empty() && base_dir.front() == '/') {
    *base = base_dir;
    return Status::Ok();
  }
  // getcwd into a fixed buffer: PATH_MAX bounds every path the kernel hands back.
  char cwd[4096];
  if (::getcwd(cwd, sizeof(cwd)) == nullptr) {
    return Status::FromErrno(errno,
                             "tier spec: resolving relative tier paths against the "
                             "working directory");
  }
  *base = std::filesystem::path(cwd) / base_dir;
  return Status::Ok();
}

// Parses SIZE := digits [K|M|G|T] (case-insensitive, powers of 1024) into bytes rounded up to
// 4096. Returns false with *problem set when text is not one or is out of range.
bool ParseSize(std::string_view text, uint64_t* bytes, std::string* problem) {
  if (text.empty()) {
    *problem = "empty size";
    return false;
  }
  uint64_t shift = 0;
  std::string_view digits = text;
  switch (text.back()) {
    case 'k':
    case 'K':
      shift = 10;
      break;
    case 'm':
    case 'M':
      shift = 20;
      break;
    case 'g':
    case 'G':
      shift = 30;
      break;
    case 't':
    case 'T':
      shift = 40;
      break;
    default:
      break;
  }
  if (shift != 0) digits.remove_suffix(1);
  uint64_t value = 0;
  if (!ParseNumber(digits, &value, problem)) {
    *problem = "\"" + std::string(text) + "\" is not a size";
    return false;
  }
  if (value > (kMaxRamBytes >> shift)) {
    *problem = "\"" + std::string(text) + "\" is larger than 1024T";
    return false;
  }
  value <<= shift;
  if (value < kMinRamBytes) {
    *problem = "\"" + std::string(text) + "\" is smaller than 1M";
    return false;
  }
  *bytes = (value + 4095) & ~uint64_t{4095};
  return true;
}

// Makes `text` (no NUL byte) an absolute, lexically normal path without a trailing '/',
// resolving a relative one against base_dir (resolved once, on first need: getcwd may fail).
Status ResolvePath(std::string_view text, const std::string& base_dir, std::filesystem::path* base,
                   bool* base_resolved, std::string* out) {
  std::filesystem::path path(text);
  if (path.is_relative()) {
    if (!*base_resolved) {
      CKPTDB_RETURN_IF_ERROR(ResolveBase(base_dir, base));
      *base_resolved = true;
    }
    path = *base / path;
  }
  std::string normal = path.lexically_normal().string();
  while (normal.size() > 1 && normal.back() == '/') normal.pop_back();
  *out = normal;
  return Status::Ok();
}

// Parses an nfs tier's ARG, HOST:/PATH, into tier->host and tier->remote_dir (absolute,
// lexically normal, no trailing '/'). Returns "" or what is wrong.
std::string ParseNfsArg(std::string_view arg, TierSpec* tier) {
  std::string_view host;
  std::string_view rest;
  if (!arg.empty() && arg.front() == '[') {
    const size_t close = arg.find(']');
    if (close == std::string_view::npos) return "the IPv6 host has no closing ']'";
    host = arg.substr(0, close + 1);
    const std::string_view inside = host.substr(1, host.size() - 2);
    if (inside.empty()) return "empty IPv6 host between '[' and ']'";
    for (char c : inside) {
      if (!std::isxdigit(static_cast<unsigned char>(c)) && c != ':' && c != '.') {
        return "the IPv6 host \"" + std::string(host) + "\" holds a character other than hex " +
               "digits, ':' and '.'";
      }
    }
    rest = arg.substr(close + 1);
    if (rest.empty() || rest.front() != ':') return "no ':' after the IPv6 host's ']'";
    rest.remove_prefix(1);
  } else {
    const size_t colon = arg.find(':');
    if (colon == std::string_view::npos) return "no ':' between the host and the path";
    host = arg.substr(0, colon);
    rest = arg.substr(colon + 1);
    if (host.empty()) return "empty host";
    for (char c : host) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') {
        return "the host \"" + std::string(host) +
               "\" holds a character other than letters, digits, '.', '-' and '_' (an IPv6 " +
               "address goes in brackets)";
      }
    }
  }
  if (host.size() > kMaxHostBytes) {
    return "the host is " + std::to_string(host.size()) + " bytes, more than " +
           std::to_string(kMaxHostBytes);
  }
  if (rest.empty()) return "empty path after the host";
  if (rest.front() != '/') return "the server path \"" + std::string(rest) + "\" is not absolute";
  if (std::string problem = PathProblem(rest, ""); !problem.empty()) return problem;
  std::string normal = std::filesystem::path(rest).lexically_normal().string();
  while (normal.size() > 1 && normal.back() == '/') normal.pop_back();
  if (std::string problem = PathProblem(rest, normal); !problem.empty()) return problem;
  tier->host = std::string(host);
  tier->remote_dir = std::move(normal);
  return "";
}

// Parses PORT := 1 .. 65535.
bool ParsePort(std::string_view text, uint16_t* port, std::string* problem) {
  uint32_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9' || v > 65535) {
      v = UINT32_MAX;
      break;
    }
    v = v * 10 + static_cast<uint32_t>(c - '0');
  }
  if (text.empty() || v == 0 || v > 65535) {
    *problem = "\"" + std::string(text) + "\" is not a port from 1 to 65535";
    return false;
  }
  *port = static_cast<uint16_t>(v);
  return true;
}

}  // namespace

const char* TierKindName(TierKind kind) {
  switch (kind) {
    case TierKind::kTmpfs:
      return "tmpfs";
    case TierKind::kDisk:
      return "disk";
    case TierKind::kRam:
      return "ram";
    case TierKind::kNfs:
      return "nfs";
  }
  return "unknown";
}

Status ParseTierSpecs(std::string_view spec, const std::string& base_dir,
                      std::vector<TierSpec>* out) {
  const ErrorFormatter error(spec);
  if (spec.size() > kMaxSpecBytes) {
    return Status::Invalid("tier spec of " + std::to_string(spec.size()) +
                           " bytes is too long; expected at most " + std::to_string(kMaxSpecBytes) +
                           " bytes");
  }

  // Split on ';'. Tiers are counted as they are found so the count check below can name the
  // first tier too many without reading the rest.
  std::vector<std::string_view> tier_texts;
  for (size_t start = 0; start <= spec.size();) {
    const size_t end = std::min(spec.find(';', start), spec.size());
    tier_texts.push_back(Trim(spec.substr(start, end - start)));
    start = end + 1;
    if (tier_texts.size() > CKPTDB_MAX_TIERS + 1) break;
  }
  // A trailing ';' leaves an empty last piece: allowed, so a spec can be built by appending
  // "tier;" pieces. An empty piece anywhere else is a typo.
  if (tier_texts.size() > 1 && tier_texts.back().empty()) tier_texts.pop_back();
  if (tier_texts.size() > CKPTDB_MAX_TIERS) {
    return error.Invalid(
        CKPTDB_MAX_TIERS + 1, tier_texts[CKPTDB_MAX_TIERS],
        "more than " + std::to_string(CKPTDB_MAX_TIERS) + " tiers",
        "at most " + std::to_string(CKPTDB_MAX_TIERS) + " tiers (CKPTDB_MAX_TIERS)");
  }

  std::filesystem::path base;
  bool base_resolved = false;
  std::vector<TierSpec> tiers;
  tiers.reserve(tier_texts.size());
  for (size_t i = 0; i < tier_texts.size(); ++i) {
    const size_t number = i + 1;
    const std::string_view text = tier_texts[i];
    if (text.empty()) {
      return error.Invalid(number, text,
                           spec.find_first_not_of(" \t\n\r\f\v;") == std::string_view::npos
                               ? "empty spec"
                               : "empty tier",
                           kTierForm);
    }
    const size_t colon = text.find(':');
    if (colon == std::string_view::npos) {
      return error.Invalid(number, text, "missing ':' after the kind", kTierForm);
    }
    const std::string_view kind_text = Trim(text.substr(0, colon));
    TierSpec tier;
    if (kind_text == "tmpfs") {
      tier.kind = TierKind::kTmpfs;
    } else if (kind_text == "disk") {
      tier.kind = TierKind::kDisk;
    } else if (kind_text == "ram") {
      tier.kind = TierKind::kRam;
    } else if (kind_text == "nfs") {
      tier.kind = TierKind::kNfs;
    } else if (kind_text.empty()) {
      return error.Invalid(number, text, "empty kind before ':'", kTierForm);
    } else {
      return error.Invalid(number, text, "unknown kind \"" + std::string(kind_text) + "\"",
                           "one of ram, tmpfs, disk, nfs");
    }
    const bool ram = tier.kind == TierKind::kRam;
    const bool nfs = tier.kind == TierKind::kNfs;
    if (ram && i != 0) {
      return error.Invalid(
          number, text,
          "a ram tier is the fastest and must come first, not as tier " + std::to_string(number),
          "ram:SIZE as the first tier of the spec");
    }

    // ARG runs to the first ','; a path cannot contain ',' or ';', they separate.
    const std::string_view rest = text.substr(colon + 1);
    const size_t comma = rest.find(',');
    const std::string_view arg_text = Trim(rest.substr(0, comma));
    if (ram) {
      std::string problem;
      if (!ParseSize(arg_text, &tier.capacity_bytes, &problem)) {
        return error.Invalid(number, text, "ram size: " + problem, kRamSizeForm);
      }
    } else if (nfs) {
      if (std::string problem = ParseNfsArg(arg_text, &tier); !problem.empty()) {
        return error.Invalid(number, text, problem, kNfsArgForm);
      }
    } else {
      if (arg_text.empty()) {
        return error.Invalid(number, text, "empty path",
                             "a directory path after \"" + std::string(kind_text) + ":\"");
      }
      if (std::string problem = PathProblem(arg_text, ""); !problem.empty()) {
        return error.Invalid(number, text, problem, "a directory path");
      }
      CKPTDB_RETURN_IF_ERROR(ResolvePath(arg_text, base_dir, &base, &base_resolved, &tier.path));
      if (std::string problem = PathProblem(arg_text, tier.path); !problem.empty()) {
        return error.Invalid(number, text, problem, "a directory path");
      }
    }

    bool seen_keep = false;
    bool seen_every = false;
    bool seen_dir = false;
    bool seen_replicas = false;
    bool seen_port = false;
    bool seen_mount_port = false;
    // Options: each of keep, every, dir, replicas, port and mountport at most once, so a seventh
    // option is always an error and the loop ends within seven rounds of finding one.
    for (size_t start = comma; start != std::string_view::npos;) {
      const size_t end = rest.find(',', start + 1);
      const std::string_view option =
          Trim(rest.substr(start + 1, end == std::string_view::npos ? end : end - start - 1));
      start = end;
      const std::string_view options_form = ram   ? "keep=N, every=N, dir=PATH or replicas=SIZE"
                                            : nfs ? "keep=N, every=N, port=N or mountport=N"
                                                  : "keep=N or every=N";
      if (option.empty()) {
        return error.Invalid(number, text, "empty option after ','",
                             std::string(options_form) + " after each ','");
      }
      const size_t equals = option.find('=');
      if (equals == std::string_view::npos) {
        return error.Invalid(number, text, "option \"" + std::string(option) + "\" has no '='",
                             options_form);
      }
      const std::string_view key = Trim(option.substr(0, equals));
      const std::string_view value_text = Trim(option.substr(equals + 1));
      bool* seen = nullptr;
      uint64_t* field = nullptr;
      uint16_t* port = nullptr;
      if (key == "keep") {
        seen = &seen_keep;
        field = &tier.keep;
      } else if (key == "every") {
        seen = &seen_every;
        field = &tier.every;
      } else if (key == "dir" && ram) {
        seen = &seen_dir;
      } else if (key == "replicas" && ram) {
        seen = &seen_replicas;
      } else if (key == "port" && nfs) {
        seen = &seen_port;
        port = &tier.port;
      } else if (key == "mountport" && nfs) {
        seen = &seen_mount_port;
        port = &tier.mount_port;
      } else if (key == "port" || key == "mountport") {
        return error.Invalid(number, text, "option \"" + std::string(key) + "\" is for an nfs tier",
                             options_form);
      } else if (key == "dir" || key == "replicas") {
        return error.Invalid(
            number, text,
            "option \"" + std::string(key) + "\" is for the ram tier" +
                (key == "dir" ? "; a " + std::string(kind_text) + " tier's directory is its path"
                              : " (peers' replicas live in memory)"),
            options_form);
      } else {
        return error.Invalid(number, text, "unknown option \"" + std::string(key) + "\"",
                             options_form);
      }
      if (*seen) {
        return error.Invalid(number, text, "option \"" + std::string(key) + "\" given twice",
                             "each option at most once");
      }
      *seen = true;
      std::string problem;
      if (port != nullptr) {
        if (!ParsePort(value_text, port, &problem)) {
          return error.Invalid(number, text, "option \"" + std::string(key) + "\": " + problem,
                               std::string(key) + "=N");
        }
      } else if (key == "replicas") {
        if (!ParseSize(value_text, &tier.replica_bytes, &problem)) {
          return error.Invalid(number, text, "option \"replicas\": " + problem,
                               "replicas=SIZE with SIZE as for ram:SIZE");
        }
      } else if (field == nullptr) {
        if (value_text.empty()) {
          return error.Invalid(number, text, "option \"dir\": empty value", "dir=PATH");
        }
        if (std::string problem = PathProblem(value_text, ""); !problem.empty()) {
          return error.Invalid(number, text, "option \"dir\": " + problem, "dir=PATH");
        }
        CKPTDB_RETURN_IF_ERROR(
            ResolvePath(value_text, base_dir, &base, &base_resolved, &tier.path));
        if (std::string problem = PathProblem(value_text, tier.path); !problem.empty()) {
          return error.Invalid(number, text, "option \"dir\": " + problem, "dir=PATH");
        }
      } else if (!ParseNumber(value_text, field, &problem)) {
        return error.Invalid(number, text, "option \"" + std::string(key) + "\": " + problem,
                             std::string(key) + "=N with N a decimal number from 1 to 2^63");
      }
    }
    if (ram && !seen_dir) tier.path = std::string(kDefaultRamDir);
    if (i == 0 && tier.every != 1) {
      return error.Invalid(number, text,
                           "every=" + std::to_string(tier.every) +
                               " on the first tier, which captures every version",
                           "every=1 or no every option on the first tier");
    }

    if (nfs) {
      tier.path = MakeNfsPath(tier.host, tier.port, tier.mount_port, tier.remote_dir);
      tier.name = "nfs:" + tier.host + ":" + tier.remote_dir;
    } else {
      tier.name = ram ? std::string("ram") : std::string(TierKindName(tier.kind)) + ":" + tier.path;
    }
    if (tier.name.size() > kMaxNameBytes) {
      return error.Invalid(
          number, text,
          "the tier name \"" + tier.name + "\" is " + std::to_string(tier.name.size()) + " bytes",
          "at most " + std::to_string(kMaxNameBytes) + " bytes so it fits ckptdb_tier_stats.name");
    }
    // Tiers in one directory tree would see each other's files as their own (retention of one
    // deleting the other's versions), so paths must be disjoint.
    // The ram tier owns one file named for its store, not a directory: it is left out.
    // nfs tiers compare by server and path (their ports may be spelled differently).
    auto place = [](const TierSpec& t) {
      return t.kind == TierKind::kNfs ? "nfs://" + t.host + t.remote_dir : t.path;
    };
    for (size_t j = 0; j < tiers.size() && !ram; ++j) {
      if (tiers[j].kind == TierKind::kRam) continue;
      const std::string here = place(tier);
      const std::string other = place(tiers[j]);
      std::string problem;
      if (here == other) {
        problem = "path " + here + " is the same as tier " + std::to_string(j + 1) + "'s";
      } else if (SameOrInside(here, other)) {
        problem = "path " + here + " is inside tier " + std::to_string(j + 1) + "'s path " + other;
      } else if (SameOrInside(other, here)) {
        problem = "path " + here + " contains tier " + std::to_string(j + 1) + "'s path " + other;
      }
      if (!problem.empty()) {
        return error.Invalid(number, text, problem, "a directory of its own for each tier");
      }
    }
    tiers.push_back(std::move(tier));
  }
  *out = std::move(tiers);
  return Status::Ok();
}

}  // namespace ckpt::io

namespace ckpt::io {

std::string FormatTierSpec(const TierSpec& tier) {
  std::string s = tier.kind == TierKind::kRam
                      ? "ram:" + std::to_string(tier.capacity_bytes) + ",dir=" + tier.path
                      : tier.name;
  if (tier.keep != 0) s += ",keep=" + std::to_string(tier.keep);
  if (tier.every != 1) s += ",every=" + std::to_string(tier.every);
  if (tier.replica_bytes != 0) s += ",replicas=" + std::to_string(tier.replica_bytes);
  if (tier.port != 0) s += ",port=" + std::to_string(tier.port);
  if (tier.mount_port != 0) s += ",mountport=" + std::to_string(tier.mount_port);
  return s;
}

}  // namespace ckpt::io
