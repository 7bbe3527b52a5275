// The simulated device (io/device_sim.h): one machine a process, its streams threads.
#include "io/device_sim.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "util/assert.h"
#include "util/thread_name.h"

namespace ckpt::io {

// An event: complete when the stream has run everything queued before its last Record.
struct DeviceEvent {
  int device = 0;
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;   // Records made
  uint64_t completed = 0;  // of them, reached by their stream
  Status status;           // what the stream reported when it reached the last one
};

struct DeviceStream {
  struct Op {
    bool copy = true;  // else a Record of `event`
    void* dst = nullptr;
    const void* src = nullptr;
    size_t bytes = 0;
    CopyKind kind = CopyKind::kToHost;
    DeviceEvent* event = nullptr;
    uint64_t record = 0;  // which of the event's Records
  };
  int device = 0;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Op> ops;
  bool stop = false;
  Status error;  // a failed copy's, until the next event reports it
  std::thread thread;
};

namespace sim {
namespace {

struct Allocation {
  size_t bytes = 0;
  int device = 0;
};

class Machine {
 public:
  static Machine& Get() {
    static Machine* machine = new Machine;  // never destroyed: streams may outlive statics
    return *machine;
  }

  Status Configure(const Config& c) {
    if (c.devices < 1 || c.devices > kMaxDevices) {
      return Status::Invalid("simulated device: " + std::to_string(c.devices) + " devices; 1 to " +
                             std::to_string(kMaxDevices));
    }
    std::lock_guard<std::mutex> g(mu_);
    config_ = c;
    faults_ = Faults{};
    copies_ = 0;
    broken_ = Status::Ok();
    const uint32_t streams = counters_.streams;
    counters_ = Counters{};
    counters_.streams = streams;
    return Status::Ok();
  }
  void SetFaults(const Faults& f) {
    std::lock_guard<std::mutex> g(mu_);
    faults_ = f;
    copies_ = 0;
  }
  Counters Read() {
    std::lock_guard<std::mutex> g(mu_);
    return counters_;
  }
  int devices() {
    std::lock_guard<std::mutex> g(mu_);
    return config_.devices;
  }

  void* Allocate(int device, size_t bytes) {
    if (device < 0 || device >= devices() || bytes == 0) return nullptr;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    std::lock_guard<std::mutex> g(mu_);
    allocations_[reinterpret_cast<uintptr_t>(p)] = {bytes, device};
    return p;
  }
  void Free(void* p) {
    size_t bytes = 0;
    {
      std::lock_guard<std::mutex> g(mu_);
      auto it = allocations_.find(reinterpret_cast<uintptr_t>(p));
      if (it == allocations_.end()) return;
      bytes = it->second.bytes;
      allocations_.erase(it);
    }
    munmap(p, bytes);
  }

  // The device whose memory [p, p + bytes) lies in, -1 for host memory; -2 when it straddles
  // an allocation's end.
  int Owner(const void* p, size_t bytes) {
    std::lock_guard<std::mutex> g(mu_);
    return OwnerLocked(p, bytes);
  }

  Status Broken() {
    std::lock_guard<std::mutex> g(mu_);
    return broken_;
  }

  Status Pin(void* p, size_t bytes) {
    std::lock_guard<std::mutex> g(mu_);
    CKPTDB_RETURN_IF_ERROR(broken_);
    if (faults_.refuse_pin) {
      return Status::IoError("pinning " + std::to_string(bytes) +
                             " bytes of host memory: simulated device: refused (injected)");
    }
    if (OwnerLocked(p, 1) != -1) {
      return Status::Invalid("pinning: simulated device: the memory is device memory");
    }
    pinned_[reinterpret_cast<uintptr_t>(p)] = bytes;
    return Status::Ok();
  }
  void Unpin(void* p) {
    std::lock_guard<std::mutex> g(mu_);
    pinned_.erase(reinterpret_cast<uintptr_t>(p));
  }

  void StreamMade(int delta) {
    std::lock_guard<std::mutex> g(mu_);
    counters_.streams += delta;
  }
  void Queued(int delta) {
    std::lock_guard<std::mutex> g(mu_);
    queued_ += delta;
    counters_.max_queued = std::max(counters_.max_queued, queued_);
  }

  // Runs one copy on `device`'s engine for its direction: the faults, the latency, the bytes, and
  // the time they take at the engine's bandwidth.
  Status RunCopy(int device, const DeviceStream::Op& op) {
    const bool to_host = op.kind == CopyKind::kToHost;
    bool fail = false;
    Config config;
    {
      std::lock_guard<std::mutex> g(mu_);
      counters_.copies++;
      const int64_t number = copies_++;
      if (!broken_.ok()) return broken_;
      if (number == faults_.vanish_at) {
        broken_ = Status::IoError("simulated device " + std::to_string(device) +
                                  ": the device is gone (injected at copy " +
                                  std::to_string(number) + ")");
        return broken_;
      }
      if (number == faults_.sticky_at) {
        broken_ = Status::IoError("simulated device " + std::to_string(device) +
                                  ": an illegal memory access, sticky: every later call fails "
                                  "(injected at copy " +
                                  std::to_string(number) + ")");
        return broken_;
      }
      fail = number == faults_.fail_copy;
      const void* host = to_host ? op.dst : op.src;
      if (!PinnedLocked(host, op.bytes)) counters_.pageable_copies++;
      config = config_;
    }
    if (config.latency_ns > 0)
      std::this_thread::sleep_for(std::chrono::nanoseconds(config.latency_ns));
    const uint64_t rate = to_host ? config.to_host_bytes_per_s : config.to_device_bytes_per_s;
    {
      std::lock_guard<std::mutex> engine(engines_[device][to_host ? 0 : 1]);
      const auto start = std::chrono::steady_clock::now();
      if (!fail) std::memcpy(op.dst, op.src, op.bytes);
      if (rate > 0) {
        const double seconds = static_cast<double>(op.bytes) / static_cast<double>(rate);
        std::this_thread::sleep_until(start + std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                  std::chrono::duration<double>(seconds)));
      }
    }
    std::lock_guard<std::mutex> g(mu_);
    (to_host ? counters_.bytes_to_host : counters_.bytes_to_device) += op.bytes;
    if (fail) {
      return Status::IoError("simulated device " + std::to_string(device) + ": a copy of " +
                             std::to_string(op.bytes) + " bytes failed (injected)");
    }
    return Status::Ok();
  }

 private:
  int OwnerLocked(const void* p, size_t bytes) const {
    const uintptr_t at = reinterpret_cast<uintptr_t>(p);
    auto it = allocations_.upper_bound(at);
    if (it == allocations_.begin()) return -1;
    --it;
    if (at >= it->first + it->second.bytes) return -1;
    if (bytes > it->first + it->second.bytes - at) return -2;
    return it->second.device;
  }
  bool PinnedLocked(const void* p, size_t bytes) const {
    const uintptr_t at = reinterpret_cast<uintptr_t>(p);
    auto it = pinned_.upper_bound(at);
    if (it == pinned_.begin()) return false;
    --it;
    return at >= it->first && bytes <= it->first + it->second - at;
  }

  std::mutex mu_;
  Config config_;
  Faults faults_;
  int64_t copies_ = 0;
  Status broken_;  // sticky or vanished: every call's answer
  Counters counters_;
  uint32_t queued_ = 0;
  std::map<uintptr_t, Allocation> allocations_;
  std::map<uintptr_t, size_t> pinned_;
  std::mutex engines_[kMaxDevices][2];  // each device's copy engines: to host, to device
};

void StreamLoop(DeviceStream* s) {
  SetThreadName("ckpt-sim-stream");
  Machine& m = Machine::Get();
  std::unique_lock<std::mutex> lock(s->mu);
  for (;;) {
    s->cv.wait(lock, [&] { return s->stop || !s->ops.empty(); });
    if (s->ops.empty()) return;
    DeviceStream::Op op = s->ops.front();
    lock.unlock();
    if (op.copy) {
      Status st = m.RunCopy(s->device, op);
      m.Queued(-1);
      lock.lock();
      if (!st.ok() && s->error.ok()) s->error = st;
    } else {
      lock.lock();
      Status reported = s->error;
      s->error = Status::Ok();
      std::lock_guard<std::mutex> g(op.event->mu);
      if (op.record == op.event->recorded) {  // else recorded again since: that Record decides
        op.event->completed = op.record;
        op.event->status = reported;
        op.event->cv.notify_all();
      }
    }
    s->ops.pop_front();
  }
}

class SimDevice final : public Device {
 public:
  std::string Describe() const override {
    return "simulated device, " + std::to_string(Machine::Get().devices()) + " device(s)";
  }

  Status Locate(const void* p, int* device) override {
    Machine& m = Machine::Get();
    CKPTDB_RETURN_IF_ERROR(m.Broken().WithContext("asking where a pointer lives"));
    const int owner = m.Owner(p, 1);
    *device = owner < 0 ? -1 : owner;
    return Status::Ok();
  }

  Status Pin(void* p, size_t bytes) override {
    if (bytes == 0) return Status::Ok();
    return Machine::Get().Pin(p, bytes);
  }
  void Unpin(void* p) override { Machine::Get().Unpin(p); }

  Status CreateStream(int device, DeviceStream** out) override {
    Machine& m = Machine::Get();
    CKPTDB_RETURN_IF_ERROR(m.Broken().WithContext("creating a stream"));
    CKPTDB_RETURN_IF_ERROR(CheckOrdinal(device, "creating a stream"));
    auto* s = new DeviceStream;
    s->device = device;
    s->thread = std::thread(StreamLoop, s);
    m.StreamMade(1);
    *out = s;
    return Status::Ok();
  }
  void DestroyStream(DeviceStream* s) override {
    if (s == nullptr) return;
    {
      std::lock_guard<std::mutex> g(s->mu);
      s->stop = true;
      s->cv.notify_all();
    }
    s->thread.join();  // after what is queued has run, as a runtime finishes a stream's work
    Machine::Get().StreamMade(-1);
    delete s;
  }

  Status CreateEvent(int device, DeviceEvent** out) override {
    CKPTDB_RETURN_IF_ERROR(Machine::Get().Broken().WithContext("creating an event"));
    CKPTDB_RETURN_IF_ERROR(CheckOrdinal(device, "creating an event"));
    auto* e = new DeviceEvent;
    e->device = device;
    *out = e;
    return Status::Ok();
  }
  void DestroyEvent(DeviceEvent* e) override { delete e; }

  Status CopyAsync(DeviceStream* s, void* dst, const void* src, size_t bytes,
                   CopyKind kind) override {
    const bool to_host = kind == CopyKind::kToHost;
    Machine& m = Machine::Get();
    if (Status broken = m.Broken(); !broken.ok()) {
      return broken.WithContext(DescribeCopy(kind, bytes, s->device));
    }
    if (bytes == 0) return Status::Ok();
    const void* device_side = to_host ? src : dst;
    const void* host_side = to_host ? dst : src;
    if (m.Owner(device_side, bytes) != s->device || m.Owner(host_side, bytes) != -1) {
      return Status::Invalid(DescribeCopy(kind, bytes, s->device) +
                             ": simulated device: invalid argument (the " +
                             (to_host ? "source" : "destination") + " is not within device " +
                             std::to_string(s->device) + "'s memory, or the " +
                             (to_host ? "destination" : "source") + " is not host memory)");
    }
    m.Queued(1);
    std::lock_guard<std::mutex> g(s->mu);
    s->ops.push_back({true, dst, src, bytes, kind, nullptr, 0});
    s->cv.notify_one();
    return Status::Ok();
  }

  // Recorded even on a broken device: a copy queued just before may have broken it as it ran,
  // and its event must still complete (with the error) for the queue to know it has ended.
  Status Record(DeviceEvent* e, DeviceStream* s) override {
    uint64_t record = 0;
    {
      std::lock_guard<std::mutex> g(e->mu);
      record = ++e->recorded;
    }
    std::lock_guard<std::mutex> g(s->mu);
    s->ops.push_back({false, nullptr, nullptr, 0, CopyKind::kToHost, e, record});
    s->cv.notify_one();
    return Status::Ok();
  }

  // An event completes when its stream reaches it, broken device or not (after a sticky error
  // the stream runs on, failing each copy at once): until then it is in use.
  Status Query(DeviceEvent* e, bool* done) override {
    {
      std::lock_guard<std::mutex> g(e->mu);
      *done = e->completed == e->recorded;
      if (!*done) return Status::Ok();
      if (!e->status.ok()) return e->status;
    }
    return Machine::Get().Broken().WithContext("a copy on the simulated device");
  }

  Status Wait(DeviceEvent* e) override {
    {
      std::unique_lock<std::mutex> lock(e->mu);
      e->cv.wait(lock, [&] { return e->completed == e->recorded; });
      if (!e->status.ok()) return e->status;
    }
    return Machine::Get().Broken().WithContext("a copy on the simulated device");
  }

 private:
  static Status CheckOrdinal(int device, const char* what) {
    const int n = Machine::Get().devices();
    if (device < 0 || device >= n) {
      return Status::Invalid(std::string(what) + ": simulated device " + std::to_string(device) +
                             " is not one of the " + std::to_string(n) + " present");
    }
    return Status::Ok();
  }
};

}  // namespace

Status Configure(const Config& config) { return Machine::Get().Configure(config); }
void SetFaults(const Faults& faults) { Machine::Get().SetFaults(faults); }
Counters Read() { return Machine::Get().Read(); }
void* Allocate(int device, size_t bytes) { return Machine::Get().Allocate(device, bytes); }
void Free(void* p) { Machine::Get().Free(p); }

Status Open(std::unique_ptr<Device>* out) {
  CKPTDB_RETURN_IF_ERROR(Machine::Get().Broken().WithContext("opening the simulated device"));
  *out = std::make_unique<SimDevice>();
  return Status::Ok();
}

}  // namespace sim

std::string DescribeCopy(CopyKind kind, size_t bytes, int device) {
  return std::string(kind == CopyKind::kToHost ? "copying device memory to the host"
                                               : "copying host memory to the device") +
         " (" + std::to_string(bytes) + " bytes, device " + std::to_string(device) + ")";
}

Status OpenDevice(const std::string& which, std::unique_ptr<Device>* out) {
  if (which.empty() || which == "auto") return OpenRuntimeDevice(out);
  if (which == "sim") return sim::Open(out);
  return Status::Invalid("device \"" + which.substr(0, 64) +
                         "\" is not one of auto (the build's GPU runtime), sim (the simulated "
                         "device)");
}

}  // namespace ckpt::io
