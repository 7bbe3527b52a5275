// libFuzzer target for a rank's holdings report (engine/holdings.h), which the coordinator reads
// from every registration and heartbeat off the network: any bytes as a report. What parses must
// encode back to the very same bytes (nothing is accepted that EncodeHoldings could not have
// written), every refusal is Corrupt, and no input may read past its end, allocate without
// bound, or trip a sanitizer.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "ckptdb/ckptdb.h"
#include "engine/holdings.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckpt::engine;
  HoldingsReport report;
  ckpt::Status st = ParseHoldings(std::span<const uint8_t>(data, size), "fuzz", &report);
  if (!st.ok()) {
    if (st.code() != CKPTDB_ECORRUPT) std::abort();
    return 0;
  }
  const std::vector<uint8_t> again = EncodeHoldings(report);
  if (again.size() != size || !std::equal(again.begin(), again.end(), data)) std::abort();
  return 0;
}
