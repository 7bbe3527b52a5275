#include "format/checksum.h"

#include <xxh_x86dispatch.h>

#include "util/assert.h"

namespace ckpt::format {

Xxh3Stream::Xxh3Stream() : state_(XXH3_createState()) {
  CKPTDB_ASSERT(state_ != nullptr);
  Reset();
}
Xxh3Stream::~Xxh3Stream() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }
void Xxh3Stream::Reset() { XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_)); }
void Xxh3Stream::Update(const void* data, size_t length_bytes) {
  XXH3_64bits_update_dispatch(static_cast<XXH3_state_t*>(state_), data, length_bytes);
}
uint64_t Xxh3Stream::Digest() const {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
}

uint64_t Xxh3(const void* data, size_t length_bytes) {
  return XXH3_64bits_dispatch(data, length_bytes);
}

}  // namespace ckpt::format
