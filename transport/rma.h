// One-sided memory access between the processes of one host, over UCX (issue 21; docs/transport.md,
// "One-sided puts and gets").
//
// A process exposes a window: memory UCX allocates (ucp_mem_map with UCP_MEM_MAP_ALLOCATE) and
// describes with a remote key. The window's descriptor (its id, size, address, the RMA worker's
// address and the packed remote key) travels to a peer over the connection's authenticated
// channel; the peer attaches it and writes (ucp_put_nbx) and reads (ucp_get_nbx) the window
// without the exposing process taking part.
//
// The rule for when this path is used, since UCX 1.13 cannot say which transports an endpoint
// uses (no UCP_EP_ATTR_FIELD_TRANSPORTS): a window is attached only when (1) the RMA context has a
// shared-memory transport the job's UCX_TLS allows (posix, else sysv: RmaTransports), (2)
// ucp_ep_create reaches the peer's RMA worker over it (only on the same host), and (3)
// ucp_rkey_ptr maps the window into this process. Then every put and get is a memory copy into or
// out of a mapping this process holds: nothing crosses a wire, no message is sent, and a peer
// that dies cannot fail a transfer half-way (its window's pages stay mapped here until detached).
// That is why these endpoints run without UCX's peer-failure handling, which UCX 1.13's
// shared-memory transports lack (docs/transport.md), and why a UCX fatal error cannot follow a
// peer's death. Anything else (another host, RDMA-only memory) is NotSupported at attach, and the
// caller keeps its message path.
//
// Why windows are UCX's memory and not the caller's: in UCX 1.13 shared-memory RMA works only on
// memory its mm memory domains allocated (they cannot register other memory; CMA registers any,
// but its zero-copy lanes carry no put/get without an active-message lane to emulate them, and
// that lane has no peer-failure handling either). So a window is a landing area that the exposing
// process copies out of (and into, for reads), and a caller sizes it as slots of a bounded ring.
//
// Bounds: a window is at most kMaxRmaWindowBytes; a descriptor at most kMaxRmaDescriptorBytes (it
// fits a message body), with a worker address and a remote key of at most
// kMaxRmaWorkerAddressBytes and kMaxRmaKeyBytes. Every UCX call of a domain runs under its mutex
// (its worker is single-threaded); a put or get is a copy, so waits are short.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "transport/wire_format.h"
#include "util/status.h"

namespace ckpt::transport {

// The UCX transports one-sided access may use, from a UCX_TLS-style list ("tcp", "shm,tcp",
// "^sysv", ""; empty reads UCX_TLS from the environment): "posix" where the list allows it
// ("", "all", "shm", "sm", "mm", "posix", or a "^" list not naming one of those), else "sysv"
// where it allows that; empty otherwise (a job that asked for tcp only gets no one-sided path).
std::string RmaTransports(const std::string& tls);

class RmaDomain;

// Memory this process lets peers on its host write and read.
class RmaWindow {
 public:
  ~RmaWindow();
  RmaWindow(const RmaWindow&) = delete;
  RmaWindow& operator=(const RmaWindow&) = delete;
  uint8_t* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t id() const { return id_; }
  const std::vector<uint8_t>& descriptor() const { return descriptor_; }

 private:
  friend class RmaDomain;
  RmaWindow() = default;
  std::shared_ptr<RmaDomain> domain_;
  void* mem_ = nullptr;  // ucp_mem_h
  uint8_t* data_ = nullptr;
  uint64_t bytes_ = 0;
  uint64_t id_ = 0;
  std::vector<uint8_t> descriptor_;
};

// A peer's window, attached: puts and gets are copies into and out of its mapping.
class RemoteWindow {
 public:
  ~RemoteWindow();
  RemoteWindow(const RemoteWindow&) = delete;
  RemoteWindow& operator=(const RemoteWindow&) = delete;
  uint64_t bytes() const { return bytes_; }
  uint64_t id() const { return id_; }
  // Writes [src, src + bytes) at `offset` of the window with ucp_put_nbx and flushes the
  // endpoint, so the bytes are in the window when it returns. EINVAL outside the window.
  Status Put(uint64_t offset, const void* src, uint64_t bytes);
  // Reads `bytes` at `offset` of the window into dst with ucp_get_nbx.
  Status Get(uint64_t offset, void* dst, uint64_t bytes);

 private:
  friend class RmaDomain;
  RemoteWindow() = default;
  Status Range(uint64_t offset, uint64_t bytes, const char* op) const;
  std::shared_ptr<RmaDomain> domain_;
  std::string what_;
  void* ep_ = nullptr;    // ucp_ep_h
  void* rkey_ = nullptr;  // ucp_rkey_h
  uint64_t address_ = 0;
  uint64_t bytes_ = 0;
  uint64_t id_ = 0;
};

// One UCX context and worker for one-sided access (UCP_FEATURE_RMA only), apart from the
// transport's message context.
class RmaDomain : public std::enable_shared_from_this<RmaDomain> {
 public:
  // *out is nullptr (and the status Ok) when `tls` leaves no transport for one-sided access.
  static Status Open(const std::string& name, const std::string& tls,
                     std::shared_ptr<RmaDomain>* out);
  ~RmaDomain();
  RmaDomain(const RmaDomain&) = delete;
  RmaDomain& operator=(const RmaDomain&) = delete;

  const std::string& transports() const { return transports_; }  // "posix" or "sysv"
  // A window of `bytes` (at most kMaxRmaWindowBytes), zeroed.
  Status Expose(uint64_t bytes, std::shared_ptr<RmaWindow>* out);
  // Attaches a peer's window from its descriptor (the rule at the top of this file). `what`
  // names the peer in errors. NotSupported when the window cannot be mapped here (another
  // host); Invalid for a descriptor that does not decode.
  Status Attach(std::span<const uint8_t> descriptor, const std::string& what,
                std::shared_ptr<RemoteWindow>* out);

 private:
  friend class RmaWindow;
  friend class RemoteWindow;
  RmaDomain() = default;
  Status Start(const std::string& name, const std::string& tls);
  // Progresses the worker until `request` (a ucs_status_ptr_t) completes; frees it.
  Status WaitLocked(void* request, const std::string& what);

  std::string name_;
  std::string transports_;
  std::mutex mu_;
  void* context_ = nullptr;  // ucp_context_h
  void* worker_ = nullptr;   // ucp_worker_h
  std::vector<uint8_t> worker_address_;
};

}  // namespace ckpt::transport
