#include "io/fault_io.h"

#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <map>
#include <thread>

#include "util/assert.h"

namespace ckpt::io {
namespace {

// A queue whose read, write and fsync completions of files FaultIo may turn into failures. Requests
// go to the base queue unchanged (the kernel does the work); only what Reap reports is changed.
class FaultQueue final : public IoQueue {
 public:
  FaultQueue(FaultIo* io, std::unique_ptr<IoQueue> base) : io_(io), base_(std::move(base)) {}

  Status RegisterBuffers(std::span<const iovec> buffers) override {
    return base_->RegisterBuffers(buffers);
  }
  Status Submit(std::span<const IoRequest> requests) override {
    // Files only: the tier manager also reads its wake-up eventfd through the queue.
    for (const IoRequest& r : requests) {
      struct stat st {};
      if (::fstat(r.fd, &st) == 0 && S_ISREG(st.st_mode)) ops_[r.tag] = r.op;
    }
    return base_->Submit(requests);
  }
  Status Reap(size_t min_completions, std::vector<IoCompletion>* out, int timeout_ms) override {
    const size_t before = out->size();
    Status st = base_->Reap(min_completions, out, timeout_ms);
    for (size_t i = before; i < out->size(); ++i) {
      IoCompletion& c = (*out)[i];
      auto op = ops_.find(c.tag);
      if (op == ops_.end()) continue;
      const IoRequest::Op kind = op->second;
      ops_.erase(op);
      if (c.result < 0) continue;
      const int error = io_->Take(kind == IoRequest::Op::kRead    ? FaultIo::Call::kRead
                                  : kind == IoRequest::Op::kWrite ? FaultIo::Call::kWrite
                                                                  : FaultIo::Call::kSync);
      if (error == FaultIo::kShort) {
        c.result /= 2;  // a completion of 1 byte reports none
      } else if (error != 0) {
        c.result = -error;
      }
    }
    return st;
  }
  size_t outstanding() const override { return base_->outstanding(); }
  int WaitFd() const override { return base_->WaitFd(); }

 private:
  FaultIo* io_;
  std::unique_ptr<IoQueue> base_;
  std::map<uint64_t, IoRequest::Op> ops_;  // by tag: one owner thread per queue
};

}  // namespace

const char* FaultIo::CallName(Call call) {
  switch (call) {
    case Call::kWrite:
      return "write";
    case Call::kSync:
      return "fsync";
    case Call::kRename:
      return "rename";
    case Call::kSyncDir:
      return "directory fsync";
    case Call::kCreate:
      return "create";
    case Call::kWriteFileDurably:
      return "durable file write";
    case Call::kRead:
      return "read";
    case Call::kMap:
      return "mapped file open";
  }
  return "?";
}

void FaultIo::Arm(Call call, uint64_t nth, int error) {
  CKPTDB_ASSERT(error > 0 || (error == kShort && (call == Call::kRead || call == Call::kWrite)));
  armed_nth_ = 0;  // no call matches while the rest changes
  armed_call_ = static_cast<int>(Index(call));
  armed_error_ = error;
  fired_ = false;
  armed_nth_ = nth;
}

void FaultIo::Reset() {
  armed_nth_ = 0;
  armed_call_ = -1;
  fired_ = false;
  for (auto& c : counts_) c = 0;
}

int FaultIo::Take(Call call) {
  if (const uint32_t us = latency_us_[Index(call)].load(); us > 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(us));
  }
  const uint64_t n = ++counts_[Index(call)];
  if (armed_call_.load() != static_cast<int>(Index(call)) || armed_nth_.load() != n) return 0;
  fired_ = true;
  return armed_error_.load();
}

Status FaultIo::NewQueue(const QueueOptions& options, std::unique_ptr<IoQueue>* out) {
  std::unique_ptr<IoQueue> inner;
  CKPTDB_RETURN_IF_ERROR(base()->NewQueue(options, &inner));
  *out = std::make_unique<FaultQueue>(this, std::move(inner));
  return Status::Ok();
}

Status FaultIo::Open(const std::string& path, const OpenOptions& options, int* fd,
                     bool* direct_out) {
  if (options.mode == OpenOptions::Mode::kCreateWrite) {
    if (int error = Take(Call::kCreate)) {
      return Status::FromErrno(error, "open " + path + " for writing (injected)");
    }
  }
  return base()->Open(path, options, fd, direct_out);
}

Status FaultIo::Rename(const std::string& from, const std::string& to) {
  if (int error = Take(Call::kRename)) {
    return Status::FromErrno(error, "rename " + from + " to " + to + " (injected)");
  }
  return base()->Rename(from, to);
}

Status FaultIo::OpenMappedFile(const std::string& path, const MappedFileOptions& options,
                               std::shared_ptr<MappedFile>* out) {
  if (int error = Take(Call::kMap)) {
    return Status::FromErrno(error, "map " + path + " (injected)");
  }
  return base()->OpenMappedFile(path, options, out);
}

Status FaultIo::SyncDir(const std::string& path) {
  if (int error = Take(Call::kSyncDir)) {
    return Status::FromErrno(error, "fsync directory " + path + " (injected)");
  }
  return base()->SyncDir(path);
}

Status FaultIo::WriteFileDurably(const std::string& path, const std::string& contents) {
  if (int error = Take(Call::kWriteFileDurably)) {
    return Status::FromErrno(error, "write " + path + " durably (injected)");
  }
  return base()->WriteFileDurably(path, contents);
}

}  // namespace ckpt::io
