// Wire encoding for transport and engine messages: little-endian integers and length-prefixed
// strings and blobs, written to a growing buffer and read back with every length checked against
// what is left (a message from the network is hostile until it has been read completely).
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "util/status.h"

namespace ckpt::transport {

class WireWriter {
 public:
  void U8(uint8_t v) { buf_.push_back(v); }
  void U16(uint16_t v) { Int(v, 2); }
  void U32(uint32_t v) { Int(v, 4); }
  void U64(uint64_t v) { Int(v, 8); }
  void I32(int32_t v) { Int(static_cast<uint32_t>(v), 4); }
  void Bytes(std::span<const uint8_t> b) {
    U32(static_cast<uint32_t>(b.size()));
    buf_.insert(buf_.end(), b.begin(), b.end());
  }
  void Str(const std::string& s) { Bytes({reinterpret_cast<const uint8_t*>(s.data()), s.size()}); }
  void Raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    buf_.insert(buf_.end(), b, b + n);
  }
  std::vector<uint8_t>& buffer() { return buf_; }
  std::vector<uint8_t> Take() { return std::move(buf_); }

 private:
  void Int(uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) buf_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  std::vector<uint8_t> buf_;
};

// Reads fields in order; the first short read makes every later read fail and Finish() report
// which field of `what` ran past the end (or that bytes were left over).
class WireReader {
 public:
  WireReader(std::span<const uint8_t> in, std::string what) : in_(in), what_(std::move(what)) {}
  uint8_t U8(const char* field) { return static_cast<uint8_t>(Int(1, field)); }
  uint16_t U16(const char* field) { return static_cast<uint16_t>(Int(2, field)); }
  uint32_t U32(const char* field) { return static_cast<uint32_t>(Int(4, field)); }
  uint64_t U64(const char* field) { return Int(8, field); }
  int32_t I32(const char* field) { return static_cast<int32_t>(U32(field)); }
  // A blob of at most `max` bytes (a view into the input).
  std::span<const uint8_t> Bytes(const char* field, size_t max) {
    uint32_t n = U32(field);
    if (!ok()) return {};
    if (n > max || n > in_.size() - pos_) {
      Fail(field, "is " + std::to_string(n) + " bytes, more than " +
                      std::to_string(std::min<size_t>(max, in_.size() - pos_)) + " allowed");
      return {};
    }
    auto out = in_.subspan(pos_, n);
    pos_ += n;
    return out;
  }
  std::string Str(const char* field, size_t max) {
    auto b = Bytes(field, max);
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
  }
  void Raw(void* out, size_t n, const char* field) {
    if (!ok()) return;
    if (n > in_.size() - pos_) {
      Fail(field, "runs past the end");
      return;
    }
    std::memcpy(out, in_.data() + pos_, n);
    pos_ += n;
  }
  bool ok() const { return error_.empty(); }
  size_t remaining() const { return in_.size() - pos_; }  // bytes not read yet
  // Ok when every field was read and nothing is left over.
  Status Finish() const {
    if (!ok()) return Status::Corrupt(error_);
    if (pos_ != in_.size()) {
      return Status::Corrupt(what_ + ": " + std::to_string(in_.size() - pos_) +
                             " unexpected bytes after the last field");
    }
    return Status::Ok();
  }

 private:
  uint64_t Int(int bytes, const char* field) {
    if (!ok()) return 0;
    if (static_cast<size_t>(bytes) > in_.size() - pos_) {
      Fail(field, "runs past the end of the message");
      return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= uint64_t{in_[pos_ + i]} << (8 * i);
    pos_ += bytes;
    return v;
  }
  void Fail(const char* field, const std::string& why) {
    if (ok()) error_ = what_ + ": field " + field + " " + why;
  }

  std::span<const uint8_t> in_;
  size_t pos_ = 0;
  std::string what_;
  std::string error_;
};

}  // namespace ckpt::transport
