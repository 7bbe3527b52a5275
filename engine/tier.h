// A directory tier (tmpfs or disk) as the engine sees it: a place that holds segment files named
// by version and rank, written durably (DESIGN.md section 5: write to a temporary name, fsync the
// file, rename, fsync the directory). The data bytes go through the engine's IoQueue; this class
// owns naming, the ownership marker and the metadata steps.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/io.h"
#include "io/tier_spec.h"

namespace ckpt::engine {

struct SegmentFileName {
  uint64_t version = 0;
  uint32_t rank = 0;
  bool temporary = false;  // "<name>.tmp": a segment that was never published
  std::string name;
};

class Tier {
 public:
  Tier(io::Io* io, io::TierSpec spec) : io_(io), spec_(std::move(spec)) {}

  // Creates the directory if needed and checks or writes its marker file so that two jobs never
  // share a tier directory by accident (the second is refused with a message naming both). A
  // marker that is missing or damaged (unparseable, or naming another job) in a directory that
  // holds this store's segments is Corrupt, and nothing is written.
  // Probes whether O_DIRECT works here. read_only: only checks the marker if it exists.
  Status Open(uint64_t job_id, bool read_only);

  const io::TierSpec& spec() const { return spec_; }
  const std::string& name() const { return spec_.name; }
  bool direct() const { return direct_; }
  bool wrote_marker() const { return wrote_marker_; }  // Open created the marker
  bool TakesVersion(uint64_t version) const { return version % spec_.every == 0; }

  std::string SegmentPath(uint64_t version, uint32_t rank) const;
  std::string TempPath(uint64_t version, uint32_t rank) const;

  // Creates (truncating) the temporary file for a segment; O_DIRECT on disk tiers.
  Status CreateTemp(uint64_t version, uint32_t rank, int* fd);
  // After the caller has written and fsynced fd: closes it, renames the temporary file to its
  // final name and fsyncs the directory.
  Status Publish(uint64_t version, uint32_t rank, int fd);
  // Deletes both names of a segment (absent is fine) and fsyncs the directory.
  Status RemoveSegment(uint64_t version, uint32_t rank);
  // Ok (and *example, a path) when the directory holds a published segment whose header names
  // job_id: what tells this store's directory with a lost or damaged marker from another's.
  Status HoldsSegmentsOf(uint64_t job_id, std::string* example) const;
  // ckptdb repair: writes the marker again when it is missing or damaged and the directory holds
  // this store's segments (*rewrote says so); changes nothing otherwise.
  Status RepairMarker(uint64_t job_id, bool* rewrote);
  // Segment files in the directory; other names are ignored.
  Status ListSegments(std::vector<SegmentFileName>* out) const;

  static bool ParseSegmentFileName(const std::string& name, SegmentFileName* out);
  static constexpr const char* kMarkerName = "CKPTDB-TIER";

 private:
  // Writes the marker durably under a name of this writer's, then renames it into place.
  Status WriteMarker(uint64_t job_id);

  io::Io* io_;
  io::TierSpec spec_;
  bool direct_ = false;
  bool wrote_marker_ = false;
};

}  // namespace ckpt::engine
