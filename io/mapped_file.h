// MappedFile: a file in a memory file system mapped whole and shared, for the replicas and the
// parity a node keeps for its peers (engine/replica_store.h, engine/parity_store.h), opened
// through the Io seam (Io::OpenMappedFile) so that fault injection reaches it. The bytes written
// through the mapping are not traced by io/crash_model.h's RecordingIo (no call writes them);
// the creates, renames and removes around them go through the Io like any other file's.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "util/status.h"

namespace ckpt::io {

struct MappedFileOptions {
  bool create = false;     // create the file (O_EXCL: an existing one is refused)
  bool read_only = false;  // map PROT_READ at the file's size (`ckptdb serve`, verify)
  uint64_t bytes = 0;      // read-write: the size the file is resized to and mapped at

  static MappedFileOptions New(uint64_t bytes) { return {true, false, bytes}; }
  static MappedFileOptions Existing(uint64_t bytes) { return {false, false, bytes}; }
  static MappedFileOptions ReadOnly() { return {false, true, 0}; }
};

// A file mapped shared and writable; unmapped and closed when the last holder lets go (a fetch
// being sent keeps its replica's mapping alive even after retention dropped the file).
class MappedFile {
 public:
  // The POSIX implementation of Io::OpenMappedFile (what PosixIo calls); everything else opens
  // one through its Io, so that fault injection reaches it.
  static Status Open(const std::string& path, const MappedFileOptions& options,
                     std::shared_ptr<MappedFile>* out);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  uint8_t* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  int fd() const { return fd_; }  // open while this object lives
  // Resizes the file and its mapping (a no-op at the same size: the mapping, and so the
  // page-table entries, stay).
  Status Resize(uint64_t bytes, const std::string& what);
  // Maps [offset, offset + bytes) of pages the file already has into the page table at once.
  // On these VMs a page fault on an existing tmpfs page costs about 5 us (0.9 GB/s), a populate
  // about 0.15 us (28 GB/s): a fresh mapping that is about to be sent from is populated first.
  void Populate(uint64_t offset, uint64_t bytes) const;
  // Allocates every page of the file and maps them all, unless that was done since it was last
  // mapped (a populate walks every page even when all are mapped already: 35 ms for 512 MiB
  // here, a fifth of the replica's transfer; a reused spare's mapping is whole, it was received
  // into). The allocation (fallocate) makes a full file system say ENOSPC here, not kill the
  // process with SIGBUS when a byte lands in a page it cannot have.
  Status Reserve(const std::string& what) const;
  // Copies [offset, offset + bytes) of the file into dst with pread: from the page cache, without
  // mapping a page into this process (a fetch into a one-sided window: no page-table work for a
  // replica mapped since this process opened). EIO naming `what`; EINVAL outside the file.
  Status ReadAt(uint64_t offset, void* dst, uint64_t bytes, const std::string& what) const;

 private:
  MappedFile() = default;
  int fd_ = -1;
  uint8_t* data_ = nullptr;
  uint64_t bytes_ = 0;
  bool writable_ = true;
  mutable std::atomic<bool> populated_{false};  // every page of this mapping is mapped
};

}  // namespace ckpt::io
