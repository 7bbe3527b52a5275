#include "util/status.h"

#include <cerrno>
#include <cstring>

namespace ckpt {

Status Status::FromErrno(int err, const std::string& what) {
  std::string m = what + ": " + std::strerror(err);
  switch (err) {
    case ENOENT:
      return NotFound(std::move(m));
    case ENOSPC:
    case EDQUOT:
      return NoSpace(std::move(m));
    case ENOMEM:
      return NoMemory(std::move(m));
    case EEXIST:
      return Exists(std::move(m));
    case EINVAL:
    case ENAMETOOLONG:
    case ENOTDIR:
    case EISDIR:
      return Invalid(std::move(m));
    case EWOULDBLOCK:
      return Busy(std::move(m));
    case ETIMEDOUT:
      return TimedOut(std::move(m));
    case EOPNOTSUPP:
      return NotSupported(std::move(m));
    default:
      return IoError(std::move(m));
  }
}

std::string Status::ToString() const {
  if (ok()) return "CKPTDB_OK";
  return std::string(StatusCodeName(code_)) + ": " + message_;
}

Status Status::WithContext(const std::string& context) const {
  if (ok()) return *this;
  return Status(code_, context + ": " + message_);
}

const char* StatusCodeName(int status) {
  switch (status) {
    case CKPTDB_OK:
      return "CKPTDB_OK";
    case CKPTDB_EINVAL:
      return "CKPTDB_EINVAL";
    case CKPTDB_ENOTFOUND:
      return "CKPTDB_ENOTFOUND";
    case CKPTDB_EEXIST:
      return "CKPTDB_EEXIST";
    case CKPTDB_ESTATE:
      return "CKPTDB_ESTATE";
    case CKPTDB_ECORRUPT:
      return "CKPTDB_ECORRUPT";
    case CKPTDB_EIO:
      return "CKPTDB_EIO";
    case CKPTDB_ENOSPC:
      return "CKPTDB_ENOSPC";
    case CKPTDB_ETIMEDOUT:
      return "CKPTDB_ETIMEDOUT";
    case CKPTDB_ENOMEM:
      return "CKPTDB_ENOMEM";
    case CKPTDB_ESIZE:
      return "CKPTDB_ESIZE";
    case CKPTDB_ENOTSUP:
      return "CKPTDB_ENOTSUP";
    case CKPTDB_EBUSY:
      return "CKPTDB_EBUSY";
    case CKPTDB_EINTERNAL:
      return "CKPTDB_EINTERNAL";
    case CKPTDB_ESKIPPED:
      return "CKPTDB_ESKIPPED";
    case CKPTDB_EPEER:
      return "CKPTDB_EPEER";
    case CKPTDB_EAUTH:
      return "CKPTDB_EAUTH";
    default:
      return "CKPTDB_E?";
  }
}

}  // namespace ckpt
