// One-sided access on UCX (see rma.h).
#include "transport/rma.h"

#include <sodium.h>
#include <sys/mman.h>
#include <ucp/api/ucp.h>

#include <chrono>
#include <cstdlib>
#include <cstring>

#include "transport/transport.h"
#include "util/assert.h"

namespace ckpt::transport {
namespace {

// A put or get is a copy into or out of a mapping (the rule in rma.h): it completes at once or
// after a few progress calls. A wait past this is a broken endpoint, not a slow one.
constexpr int64_t kRmaWaitMs = 30000;

std::string Ucs(ucs_status_t s) { return ucs_status_string(s); }

}  // namespace

std::string RmaTransports(const std::string& tls) {
  std::string spec = tls;
  if (spec.empty()) {
    const char* env = std::getenv("UCX_TLS");
    spec = env != nullptr ? env : "";
  }
  const bool negated = !spec.empty() && spec[0] == '^';
  const std::vector<std::string> items = TlsItems(spec);
  auto named = [&](const char* tl) {
    for (const std::string& item : items) {
      if (item == tl || item == "shm" || item == "sm" || item == "mm" || item == "all") {
        return true;
      }
    }
    return false;
  };
  auto allowed = [&](const char* tl) {
    if (spec.empty() || spec == "all") return true;
    if (!negated) return named(tl);
    for (const std::string& item : items) {
      if (item == tl || item == "shm" || item == "sm" || item == "mm") return false;
    }
    return true;
  };
  if (allowed("posix")) return "posix";
  if (allowed("sysv")) return "sysv";
  return "";
}

Status RmaDomain::Open(const std::string& name, const std::string& tls,
                       std::shared_ptr<RmaDomain>* out) {
  out->reset();
  const std::string transports = RmaTransports(tls);
  if (transports.empty()) return Status::Ok();
  std::shared_ptr<RmaDomain> d(new RmaDomain());
  CKPTDB_RETURN_IF_ERROR(d->Start(name, transports));
  *out = std::move(d);
  return Status::Ok();
}

Status RmaDomain::Start(const std::string& name, const std::string& transports) {
  name_ = name;
  transports_ = transports;
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return Status::Internal(name_ + ": UCX ucp_config_read: " + Ucs(s));
  s = ucp_config_modify(config, "TLS", transports_.c_str());
  if (s == UCS_OK) {
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
    params.features = UCP_FEATURE_RMA;
    params.name = "ckptdb-rma";
    ucp_context_h context = nullptr;
    s = ucp_init(&params, config, &context);
    context_ = context;
  }
  ucp_config_release(config);
  if (s != UCS_OK) {
    return Status::NotSupported(name_ + ": UCX one-sided context over " + transports_ + ": " +
                                Ucs(s));
  }
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h worker = nullptr;
  s = ucp_worker_create(static_cast<ucp_context_h>(context_), &wp, &worker);
  if (s != UCS_OK) return Status::Internal(name_ + ": UCX one-sided worker: " + Ucs(s));
  worker_ = worker;
  ucp_address_t* address = nullptr;
  size_t address_bytes = 0;
  s = ucp_worker_get_address(worker, &address, &address_bytes);
  if (s != UCS_OK) return Status::Internal(name_ + ": UCX one-sided worker address: " + Ucs(s));
  const auto* a = reinterpret_cast<const uint8_t*>(address);
  worker_address_.assign(a, a + address_bytes);
  ucp_worker_release_address(worker, address);
  if (worker_address_.empty() || worker_address_.size() > kMaxRmaWorkerAddressBytes) {
    return Status::NotSupported(name_ + ": UCX's one-sided worker address is " +
                                std::to_string(worker_address_.size()) + " bytes, at most " +
                                std::to_string(kMaxRmaWorkerAddressBytes) + " travel");
  }
  return Status::Ok();
}

RmaDomain::~RmaDomain() {
  if (worker_ != nullptr) ucp_worker_destroy(static_cast<ucp_worker_h>(worker_));
  if (context_ != nullptr) ucp_cleanup(static_cast<ucp_context_h>(context_));
}

Status RmaDomain::WaitLocked(void* request, const std::string& what) {
  auto r = static_cast<ucs_status_ptr_t>(request);
  if (r == nullptr) return Status::Ok();
  if (UCS_PTR_IS_ERR(r)) return Status::Peer(what + ": " + Ucs(UCS_PTR_STATUS(r)));
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(kRmaWaitMs);
  ucs_status_t s = UCS_INPROGRESS;
  while ((s = ucp_request_check_status(r)) == UCS_INPROGRESS &&
         std::chrono::steady_clock::now() < until) {
    ucp_worker_progress(static_cast<ucp_worker_h>(worker_));
  }
  if (s == UCS_INPROGRESS) {
    ucp_request_cancel(static_cast<ucp_worker_h>(worker_), r);
    while (ucp_request_check_status(r) == UCS_INPROGRESS) {
      ucp_worker_progress(static_cast<ucp_worker_h>(worker_));
    }
    ucp_request_free(r);
    return Status::TimedOut(what + ": not done after " + std::to_string(kRmaWaitMs) + " ms");
  }
  ucp_request_free(r);
  return s == UCS_OK ? Status::Ok() : Status::Peer(what + ": " + Ucs(s));
}

Status RmaDomain::Expose(uint64_t bytes, std::shared_ptr<RmaWindow>* out) {
  if (bytes == 0 || bytes > kMaxRmaWindowBytes) {
    return Status::Invalid(name_ + ": a one-sided window of " + std::to_string(bytes) +
                           " bytes (1.." + std::to_string(kMaxRmaWindowBytes) + ")");
  }
  std::shared_ptr<RmaWindow> w(new RmaWindow());
  w->domain_ = shared_from_this();
  std::lock_guard<std::mutex> lock(mu_);
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  mp.length = bytes;
  mp.flags = UCP_MEM_MAP_ALLOCATE;
  ucp_mem_h mem = nullptr;
  ucs_status_t s = ucp_mem_map(static_cast<ucp_context_h>(context_), &mp, &mem);
  if (s != UCS_OK) {
    return Status::NoMemory(name_ + ": UCX could not allocate a one-sided window of " +
                            std::to_string(bytes) + " bytes over " + transports_ + ": " + Ucs(s));
  }
  w->mem_ = mem;  // unmapped by ~RmaWindow from here on
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  s = ucp_mem_query(mem, &attr);
  if (s != UCS_OK || attr.address == nullptr || attr.length < bytes) {
    return Status::Internal(name_ + ": UCX one-sided window query: " + Ucs(s));
  }
  void* packed = nullptr;
  size_t packed_bytes = 0;
  s = ucp_rkey_pack(static_cast<ucp_context_h>(context_), mem, &packed, &packed_bytes);
  if (s != UCS_OK) return Status::Internal(name_ + ": UCX rkey_pack: " + Ucs(s));
  RmaDescriptor d;
  d.rkey.assign(static_cast<uint8_t*>(packed), static_cast<uint8_t*>(packed) + packed_bytes);
  ucp_rkey_buffer_release(packed);
  if (d.rkey.empty() || d.rkey.size() > kMaxRmaKeyBytes) {
    return Status::NotSupported(name_ + ": UCX's remote key is " + std::to_string(d.rkey.size()) +
                                " bytes, at most " + std::to_string(kMaxRmaKeyBytes) + " travel");
  }
  randombytes_buf(&d.id, sizeof d.id);
  d.id |= 1;  // never 0: 0 names no window on the wire
  d.bytes = bytes;
  d.address = reinterpret_cast<uint64_t>(attr.address);
  d.worker_address = worker_address_;
  w->data_ = static_cast<uint8_t*>(attr.address);
  w->bytes_ = bytes;
  w->id_ = d.id;
  w->descriptor_ = EncodeRmaDescriptor(d);
  CKPTDB_ASSERT(w->descriptor_.size() <= kMaxRmaDescriptorBytes);
  // The pages now, on the caller's thread: a peer's first put would otherwise fault them in.
  std::memset(w->data_, 0, bytes);
  *out = std::move(w);
  return Status::Ok();
}

RmaWindow::~RmaWindow() {
  if (mem_ == nullptr) return;
  std::lock_guard<std::mutex> lock(domain_->mu_);
  ucp_mem_unmap(static_cast<ucp_context_h>(domain_->context_), static_cast<ucp_mem_h>(mem_));
}

Status RmaDomain::Attach(std::span<const uint8_t> descriptor, const std::string& what,
                         std::shared_ptr<RemoteWindow>* out) {
  RmaDescriptor d;
  CKPTDB_RETURN_IF_ERROR(DecodeRmaDescriptor(descriptor, what, &d));
  std::shared_ptr<RemoteWindow> w(new RemoteWindow());
  w->domain_ = shared_from_this();
  w->what_ = what;
  w->address_ = d.address;
  w->bytes_ = d.bytes;
  w->id_ = d.id;
  std::lock_guard<std::mutex> lock(mu_);
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep.address = reinterpret_cast<const ucp_address_t*>(d.worker_address.data());
  // No peer-failure handling, on purpose: only a window mapped into this process is kept (below),
  // and copies into a mapping cannot fail when the peer dies (rma.h).
  ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
  ucp_ep_h e = nullptr;
  ucs_status_t s = ucp_ep_create(static_cast<ucp_worker_h>(worker_), &ep, &e);
  if (s != UCS_OK) {
    return Status::NotSupported(what + ": no one-sided path over " + transports_ + ": " + Ucs(s));
  }
  w->ep_ = e;  // closed by ~RemoteWindow from here on
  ucp_rkey_h rkey = nullptr;
  s = ucp_ep_rkey_unpack(e, d.rkey.data(), &rkey);
  if (s != UCS_OK) {
    return Status::NotSupported(what + ": its window's key does not unpack here: " + Ucs(s));
  }
  w->rkey_ = rkey;
  void* mapped = nullptr;
  s = ucp_rkey_ptr(rkey, d.address, &mapped);
  if (s != UCS_OK || mapped == nullptr) {
    return Status::NotSupported(what + ": its window is not mapped into this process (" + Ucs(s) +
                                "), so a put could need the peer alive: no one-sided path");
  }
  // This process's mapping of the window is new: its pages into the page table now, not one
  // fault per page during the first puts and gets (best effort; see LIMITS.md on page faults).
  const uintptr_t page = 4096, start = reinterpret_cast<uintptr_t>(mapped) & ~(page - 1);
  (void)madvise(reinterpret_cast<void*>(start),
                reinterpret_cast<uintptr_t>(mapped) + d.bytes - start, MADV_POPULATE_WRITE);
  *out = std::move(w);
  return Status::Ok();
}

RemoteWindow::~RemoteWindow() {
  std::lock_guard<std::mutex> lock(domain_->mu_);
  if (rkey_ != nullptr) ucp_rkey_destroy(static_cast<ucp_rkey_h>(rkey_));
  if (ep_ != nullptr) {
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = 0;  // flush: local for shared memory, nothing waits on the peer
    (void)domain_->WaitLocked(ucp_ep_close_nbx(static_cast<ucp_ep_h>(ep_), &param),
                              what_ + ": closing");
  }
}

Status RemoteWindow::Range(uint64_t offset, uint64_t bytes, const char* op) const {
  if (offset > bytes_ || bytes > bytes_ - offset) {
    return Status::Invalid(what_ + ": a " + op + " of [" + std::to_string(offset) + ", +" +
                           std::to_string(bytes) + ") outside its window of " +
                           std::to_string(bytes_) + " bytes");
  }
  return Status::Ok();
}

Status RemoteWindow::Put(uint64_t offset, const void* src, uint64_t bytes) {
  CKPTDB_RETURN_IF_ERROR(Range(offset, bytes, "put"));
  if (bytes == 0) return Status::Ok();
  std::lock_guard<std::mutex> lock(domain_->mu_);
  ucp_request_param_t param{};
  CKPTDB_RETURN_IF_ERROR(
      domain_->WaitLocked(ucp_put_nbx(static_cast<ucp_ep_h>(ep_), src, bytes, address_ + offset,
                                      static_cast<ucp_rkey_h>(rkey_), &param),
                          what_ + ": put"));
  // A put's completion frees the source; the flush makes the bytes the window's.
  ucp_request_param_t flush{};
  return domain_->WaitLocked(ucp_ep_flush_nbx(static_cast<ucp_ep_h>(ep_), &flush),
                             what_ + ": flush");
}

Status RemoteWindow::Get(uint64_t offset, void* dst, uint64_t bytes) {
  CKPTDB_RETURN_IF_ERROR(Range(offset, bytes, "get"));
  if (bytes == 0) return Status::Ok();
  std::lock_guard<std::mutex> lock(domain_->mu_);
  ucp_request_param_t param{};
  return domain_->WaitLocked(ucp_get_nbx(static_cast<ucp_ep_h>(ep_), dst, bytes, address_ + offset,
                                         static_cast<ucp_rkey_h>(rkey_), &param),
                             what_ + ": get");
}

}  // namespace ckpt::transport
