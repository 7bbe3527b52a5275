// DeviceQueue (io/device_queue.h).
#include "io/device_queue.h"

#include <algorithm>
#include <string>

#include "util/assert.h"

namespace ckpt::io {

DeviceQueue::DeviceQueue(Device* device, DeviceQueueOptions options)
    : device_(device), options_(options) {
  CKPTDB_ASSERT(device_ != nullptr);
  CKPTDB_ASSERT(options_.streams_per_device >= 1 && options_.max_copies_in_flight >= 1 &&
                options_.max_bytes_in_flight >= 1);
}

DeviceQueue::~DeviceQueue() {
  Shutdown();
  std::lock_guard<std::mutex> g(mu_);
  for (Slot& s : slots_) {
    if (!s.done) (void)device_->Wait(s.event);  // its memory is the caller's until it has run
    s.done = true;
    devices_[s.copy.device].free_events.push_back(s.event);
  }
  slots_.clear();
  for (PerDevice& d : devices_) {
    for (DeviceStream* s : d.streams) device_->DestroyStream(s);  // first: nothing then records
    for (DeviceEvent* e : d.free_events) device_->DestroyEvent(e);
  }
}

void DeviceQueue::Shutdown() {
  std::lock_guard<std::mutex> g(mu_);
  shutdown_ = true;
  reap_cv_.notify_all();
}

size_t DeviceQueue::unreaped() const {
  std::lock_guard<std::mutex> g(mu_);
  return slots_.size();
}

uint64_t DeviceQueue::bytes_in_flight() const {
  std::lock_guard<std::mutex> g(mu_);
  return bytes_in_flight_;
}

Status DeviceQueue::ReadyLocked(int device, PerDevice** out, DeviceEvent** event) {
  if (device < 0 || device >= 1024) {
    return Status::Invalid("device copy: device " + std::to_string(device));
  }
  if (devices_.size() <= static_cast<size_t>(device)) devices_.resize(device + 1);
  PerDevice& d = devices_[device];
  while (d.streams.size() < options_.streams_per_device) {
    DeviceStream* s = nullptr;
    CKPTDB_RETURN_IF_ERROR(device_->CreateStream(device, &s));
    d.streams.push_back(s);
  }
  if (d.free_events.empty()) {
    DeviceEvent* e = nullptr;
    CKPTDB_RETURN_IF_ERROR(device_->CreateEvent(device, &e));
    d.free_events.push_back(e);
  }
  *event = d.free_events.back();
  d.free_events.pop_back();
  *out = &d;
  return Status::Ok();
}

bool DeviceQueue::RoomLocked(size_t bytes) const {
  return running_ < options_.max_copies_in_flight &&
         (running_ == 0 || bytes_in_flight_ + bytes <= options_.max_bytes_in_flight);
}

void DeviceQueue::MarkDoneLocked(Slot* s, Status status) {
  CKPTDB_ASSERT(!s->done && running_ > 0 && bytes_in_flight_ >= s->copy.bytes);
  s->done = true;
  s->status = std::move(status);
  running_--;
  bytes_in_flight_ -= s->copy.bytes;
}

Status DeviceQueue::Submit(const Copy& c) {
  std::unique_lock<std::mutex> lock(mu_);
  // Room comes as copies complete, whether or not they are reaped yet: a submitter that is also
  // the reaper never waits on itself. Without room, the oldest running copy is waited for here.
  for (;;) {
    if (shutdown_) return Status::State("device copy: the queue is shut down");
    if (RoomLocked(c.bytes)) break;
    PollLocked();
    if (RoomLocked(c.bytes)) break;
    auto oldest = std::find_if(slots_.begin(), slots_.end(), [](const Slot& s) { return !s.done; });
    CKPTDB_ASSERT(oldest != slots_.end());  // no room: something is running
    // Events live as long as the queue: one reused meanwhile only makes this wait longer.
    DeviceEvent* event = oldest->event;
    lock.unlock();
    (void)device_->Wait(event);  // its status is the slot's, read by the next poll
    lock.lock();
  }
  PerDevice* d = nullptr;
  DeviceEvent* event = nullptr;
  CKPTDB_RETURN_IF_ERROR(ReadyLocked(c.device, &d, &event));
  DeviceStream* stream = d->streams[d->next];
  Status st = device_->CopyAsync(stream, c.dst, c.src, c.bytes, c.kind);
  if (st.ok()) st = device_->Record(event, stream);
  if (!st.ok()) {
    // A copy refused never runs. A Record fails only on a sticky error, after which nothing
    // queued on the device runs either.
    d->free_events.push_back(event);
    return st;
  }
  d->next = (d->next + 1) % static_cast<uint32_t>(d->streams.size());
  slots_.push_back(Slot{c, event, false, Status::Ok()});
  running_++;
  bytes_in_flight_ += c.bytes;
  reap_cv_.notify_one();
  return Status::Ok();
}

void DeviceQueue::PollLocked() {
  for (Slot& s : slots_) {
    if (s.done) continue;
    bool done = false;
    Status st = device_->Query(s.event, &done);
    if (!st.ok()) done = true;  // an error is its answer
    if (done) MarkDoneLocked(&s, st);
  }
}

void DeviceQueue::TakeDoneLocked(std::vector<Completion>* out, size_t max) {
  for (auto it = slots_.begin(); it != slots_.end() && out->size() < max;) {
    if (!it->done) {
      ++it;
      continue;
    }
    Status st = it->status;
    if (!st.ok()) {
      st = st.WithContext(std::string(it->copy.kind == CopyKind::kToHost ? "a device-to-host"
                                                                         : "a host-to-device") +
                          " copy of " + std::to_string(it->copy.bytes) + " bytes on device " +
                          std::to_string(it->copy.device));
    }
    out->push_back(Completion{it->copy.tag, it->copy.bytes, st});
    devices_[it->copy.device].free_events.push_back(it->event);
    it = slots_.erase(it);
  }
}

size_t DeviceQueue::Reap(std::vector<Completion>* out, size_t max, bool wait) {
  CKPTDB_ASSERT(!reaping_.exchange(true));  // one reaper at a time
  out->clear();
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    PollLocked();
    TakeDoneLocked(out, max);
    if (!out->empty() || !wait) break;
    if (slots_.empty()) {
      if (shutdown_) break;
      reap_cv_.wait(lock, [&] { return shutdown_ || !slots_.empty(); });
      continue;
    }
    // Block on the oldest copy: only this thread removes slots, and a deque keeps the element
    // where it is while Submit appends.
    Slot* oldest = &slots_.front();
    lock.unlock();
    Status st = device_->Wait(oldest->event);
    lock.lock();
    if (!oldest->done) MarkDoneLocked(oldest, st);  // a submitter's poll may have got there first
  }
  reaping_.store(false);
  return out->size();
}

}  // namespace ckpt::io
