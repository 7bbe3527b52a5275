// Cluster's one-sided windows: granting one to a peer that asks, attaching a peer's (see
// engine/cluster_rma.h; the puts and gets themselves are in Replicate, HandleReplica, FetchRanges
// and HandleFetch in engine/cluster.cc).
#include "engine/cluster_rma.h"

#include <cstdio>

#include "engine/cluster.h"
#include "engine/cluster_wire.h"
#include "engine/internal.h"
#include "transport/rma.h"
#include "transport/wire.h"
#include "util/thread_name.h"

namespace ckpt::engine {

using transport::Reply;
using transport::Request;
using namespace cluster_wire;

// A peer asks for a window of its own in this rank's memory (the body is empty). The same
// connection asking again gets the same window.
void Cluster::HandleWindow(const Request& request, Reply* reply) {
  if (!request.body.empty() || !request.Payload().empty()) {
    return Fail(reply, Status::Invalid("a window request from " + request.peer + " with a body"));
  }
  if (rma_ == nullptr) {
    return Fail(reply, Status::NotSupported(
                           (options_.serve_only ? "ckptdb serve on node " + options_.node_id
                                                : R(options_.rank)) +
                           " has no one-sided path (UCX_TLS '" + options_.tls + "')"));
  }
  std::unique_lock<std::mutex> lock(rma_mu_);
  auto it = windows_.find(request.from);
  if (it == windows_.end()) {
    // The spare WindowMakerLoop keeps ready, else a new one (its pages are new: about 70 ms for
    // 64 MiB on these VMs, which a restarted rank's first restore would wait for).
    std::shared_ptr<transport::RmaWindow> w = std::move(spare_window_);
    spare_window_.reset();
    rma_cv_.notify_all();
    if (w == nullptr) {
      lock.unlock();
      Status st = rma_->Expose(kWindowBytes, &w);
      if (!st.ok()) return Fail(reply, st.WithContext("a window for " + request.peer));
      lock.lock();
      it = windows_.find(request.from);  // asked twice at once: the first grant stands
      if (it != windows_.end()) {
        reply->body = it->second->descriptor();
        return;
      }
    }
    while (windows_.size() >= kMaxWindows) {  // the oldest grant goes; its asker hears ESTATE
      windows_.erase(window_order_.front());
      window_order_.pop_front();
    }
    it = windows_.emplace(request.from, std::move(w)).first;
    window_order_.push_back(request.from);
  }
  reply->body = it->second->descriptor();
}

Status Cluster::WindowSlot(transport::PeerId from, uint64_t id, uint32_t slot, uint64_t bytes,
                           const std::string& what, uint8_t** at,
                           std::shared_ptr<transport::RmaWindow>* keep) {
  std::lock_guard<std::mutex> lock(rma_mu_);
  auto it = windows_.find(from);
  if (it == windows_.end() || it->second->id() != id) {
    return Status::State(what + ": names window " + std::to_string(id) +
                         ", not one this rank granted its connection (dropped, or never asked)");
  }
  if (slot >= kWindowSlots || bytes > kWindowSlotBytes) {
    return Status::Invalid(what + ": slot " + std::to_string(slot) + " of " +
                           std::to_string(bytes) + " bytes; a window has " +
                           std::to_string(kWindowSlots) + " slots of " +
                           std::to_string(kWindowSlotBytes));
  }
  *at = it->second->data() + uint64_t{slot} * kWindowSlotBytes;
  *keep = it->second;
  return Status::Ok();
}

std::shared_ptr<PeerWindow> Cluster::WindowFor(const std::string& address, transport::PeerId peer,
                                               uint32_t rank) {
  const std::string who = rank == kServeRank ? "serve" : R(rank);
  {
    std::lock_guard<std::mutex> lock(rma_mu_);
    if (auto it = remote_windows_.find(address); it != remote_windows_.end()) return it->second;
    if (rma_ == nullptr || no_window_.count(address) != 0) {
      if (rank != kServeRank) paths_[rank] = transport_->PathName(peer);
      return nullptr;
    }
  }
  // Asked and attached off the lock: a call, and UCX's endpoint creation.
  std::vector<uint8_t> descriptor;
  Status st =
      transport_->CallSync(peer, kWindow, {}, nullptr, 0, options_.call_timeout_ms, &descriptor);
  std::shared_ptr<transport::RemoteWindow> remote;
  if (st.ok()) {
    st = rma_->Attach(descriptor, who + "'s window (" + address + ")", &remote);
  }
  if (st.ok() && remote->bytes() != kWindowBytes) {
    st = Status::Invalid(who + " granted a window of " + std::to_string(remote->bytes()) +
                         " bytes, not " + std::to_string(kWindowBytes));
  }
  std::lock_guard<std::mutex> lock(rma_mu_);
  if (!st.ok()) {
    // The socket (or UCX's messages) from now on for this peer; a lost connection is not
    // remembered, the next call finds out again.
    if (st.code() != CKPTDB_EPEER && st.code() != CKPTDB_ETIMEDOUT) {
      no_window_.insert(address);
      std::fprintf(stderr, "ckptdb[%s]: no one-sided path to %s: %s\n",
                   options_.serve_only ? "serve" : R(options_.rank).c_str(), who.c_str(),
                   st.message().c_str());
    }
    if (rank != kServeRank) paths_[rank] = transport_->PathName(peer);
    return nullptr;
  }
  auto [it, inserted] = remote_windows_.emplace(address, std::make_shared<PeerWindow>());
  if (inserted) it->second->window = std::move(remote);
  if (rank != kServeRank) paths_[rank] = "rma:" + rma_->transports();
  return it->second;
}

// Keeps one window ready to grant, so that the first one a peer asks for is not made while it
// waits (see HandleWindow): made again after each grant, until the cluster stops.
void Cluster::WindowMakerLoop() {
  SetThreadName("ckpt-window");
  std::unique_lock<std::mutex> lock(rma_mu_);
  while (!stop_) {
    if (spare_window_ != nullptr) {
      rma_cv_.wait(lock);
      continue;
    }
    lock.unlock();
    std::shared_ptr<transport::RmaWindow> w;
    Status st = rma_->Expose(kWindowBytes, &w);
    lock.lock();
    if (!st.ok()) {  // HandleWindow makes its own (and says why it cannot)
      std::fprintf(stderr, "ckptdb[%s]: no spare one-sided window: %s\n",
                   options_.serve_only ? "serve" : R(options_.rank).c_str(), st.message().c_str());
      return;
    }
    spare_window_ = std::move(w);
  }
}

bool Cluster::ListensOnLoopback() const {
  const std::string& address = transport_->address();
  const std::string host = address.substr(0, address.rfind(':'));
  return host.rfind("127.", 0) == 0 || host == "::1" || host == "[::1]" || host == "localhost";
}

bool Cluster::PeerOnThisHost() const {
  auto host = [](const std::string& address) { return address.substr(0, address.rfind(':')); };
  const std::string mine = host(transport_->address());
  std::lock_guard<std::mutex> lock(mu_);
  for (uint32_t r = 0; r < table_.size(); ++r) {
    if (r != options_.rank && host(table_[r].address) == mine) return true;
  }
  return false;
}

void Cluster::DropWindow(const std::string& address) {
  std::lock_guard<std::mutex> lock(rma_mu_);
  remote_windows_.erase(address);
  no_window_.erase(address);
}

}  // namespace ckpt::engine
