// FaultIo: an Io that fails a chosen call (DESIGN.md section 8; issue 6's fault injection, first
// part), the way LevelDB's fault-injection Env does. It forwards everything to a base Io and,
// once armed, makes the nth call of one kind fail with a chosen errno: a read, write or fsync that
// the kernel completed is reported failed (what a real EIO or ENOSPC leaves: the bytes may or
// may not be there), a rename or directory sync fails before it is made. It counts every kind of
// call, so a test can first run a sequence clean to learn how many calls of each kind it makes,
// then fail each one in turn. A read or write may instead come back short (kShort), and any kind
// of call may be made slow (SetLatency). What a crash leaves on disk (dropped unsynced data,
// torn and reordered writes, per-tier durability) is io/crash_model.h's.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "io/io.h"

namespace ckpt::io {

class FaultIo final : public IoWrapper {
 public:
  enum class Call : uint8_t {
    kWrite,
    kSync,
    kRename,
    kSyncDir,
    kCreate,
    kWriteFileDurably,
    kRead,
    kMap,  // OpenMappedFile: a peer's replica or parity in memory (the error before the open)
  };
  static constexpr size_t kCalls = 8;
  static const char* CallName(Call call);

  explicit FaultIo(Io* base) : IoWrapper(base) {}

  // Arm's error for a read or write completion that reports half the bytes asked for (the
  // kernel did the work; the caller is told it did not, as a full device or a signal leaves it).
  static constexpr int kShort = -1;

  // From now on, the nth (1-based, counted from the last Reset) call of `call` fails with
  // `error` (EIO, ENOSPC, ..., or kShort for kRead and kWrite); nth 0 disarms.
  void Arm(Call call, uint64_t nth, int error);
  // Every call of `call` takes `microseconds` longer (0: none); data calls are delayed as their
  // completion is reaped, so the thread that waits for them waits longer. Reset keeps it.
  void SetLatency(Call call, uint32_t microseconds) { latency_us_[Index(call)] = microseconds; }
  // Zeroes the counts and disarms.
  void Reset();
  uint64_t Count(Call call) const { return counts_[Index(call)].load(); }
  bool Fired() const { return fired_.load(); }

  Status NewQueue(const QueueOptions& options, std::unique_ptr<IoQueue>* out) override;
  Status Open(const std::string& path, const OpenOptions& options, int* fd,
              bool* direct_out) override;
  Status Rename(const std::string& from, const std::string& to) override;
  Status SyncDir(const std::string& path) override;
  Status WriteFileDurably(const std::string& path, const std::string& contents) override;
  Status OpenMappedFile(const std::string& path, const MappedFileOptions& options,
                        std::shared_ptr<MappedFile>* out) override;

  // Counts one call of `call` (after its latency); its errno (or kShort) when this is the armed
  // one, else 0. Queues use it too.
  int Take(Call call);

 private:
  static size_t Index(Call call) { return static_cast<size_t>(call); }

  std::array<std::atomic<uint64_t>, kCalls> counts_{};
  std::array<std::atomic<uint32_t>, kCalls> latency_us_{};
  std::atomic<int> armed_call_{-1};
  std::atomic<uint64_t> armed_nth_{0};
  std::atomic<int> armed_error_{0};
  std::atomic<bool> fired_{false};
};

}  // namespace ckpt::io
