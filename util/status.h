// Status: the result of every fallible internal call. The code is one of the public CKPTDB_E*
// values so the C API passes it through unchanged; the message names the object at fault.
#pragma once

#include <string>
#include <utility>

#include "ckptdb/ckptdb.h"

namespace ckpt {

// "CKPTDB_EINVAL" for CKPTDB_EINVAL, "CKPTDB_E?" for a code the header does not define. The C
// API's ckptdb_status_name (engine/c_api.cc) returns this; layers below the engine call it here.
const char* StatusCodeName(int status);

class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status Ok() { return Status(); }
  static Status Invalid(std::string m) { return Status(CKPTDB_EINVAL, std::move(m)); }
  static Status NotFound(std::string m) { return Status(CKPTDB_ENOTFOUND, std::move(m)); }
  static Status Exists(std::string m) { return Status(CKPTDB_EEXIST, std::move(m)); }
  static Status State(std::string m) { return Status(CKPTDB_ESTATE, std::move(m)); }
  static Status Corrupt(std::string m) { return Status(CKPTDB_ECORRUPT, std::move(m)); }
  static Status IoError(std::string m) { return Status(CKPTDB_EIO, std::move(m)); }
  static Status NoSpace(std::string m) { return Status(CKPTDB_ENOSPC, std::move(m)); }
  static Status TimedOut(std::string m) { return Status(CKPTDB_ETIMEDOUT, std::move(m)); }
  static Status NoMemory(std::string m) { return Status(CKPTDB_ENOMEM, std::move(m)); }
  static Status Size(std::string m) { return Status(CKPTDB_ESIZE, std::move(m)); }
  static Status NotSupported(std::string m) { return Status(CKPTDB_ENOTSUP, std::move(m)); }
  static Status Busy(std::string m) { return Status(CKPTDB_EBUSY, std::move(m)); }
  static Status Internal(std::string m) { return Status(CKPTDB_EINTERNAL, std::move(m)); }
  static Status Skipped(std::string m) { return Status(CKPTDB_ESKIPPED, std::move(m)); }
  static Status Peer(std::string m) { return Status(CKPTDB_EPEER, std::move(m)); }
  static Status Auth(std::string m) { return Status(CKPTDB_EAUTH, std::move(m)); }
  // A status carried over the wire: `code` must be a CKPTDB_E* value (checked by the receiver).
  static Status FromCode(int code, std::string m) { return Status(code, std::move(m)); }
  // Maps an errno from a system call on `what` (a path or an operation) to a status.
  static Status FromErrno(int err, const std::string& what);

  bool ok() const { return code_ == CKPTDB_OK; }
  int code() const { return code_; }
  const std::string& message() const { return message_; }
  // "CKPTDB_ECORRUPT: segment ... fails xxh3 ..."
  std::string ToString() const;
  // Prepends context: "opening tier disk:/x: <old message>".
  Status WithContext(const std::string& context) const;

 private:
  Status(int code, std::string m) : code_(code), message_(std::move(m)) {}
  int code_ = CKPTDB_OK;
  std::string message_;
};

}  // namespace ckpt

#define CKPTDB_RETURN_IF_ERROR(expr) \
  do {                               \
    ::ckpt::Status _st = (expr);     \
    if (!_st.ok()) return _st;       \
  } while (0)
