/* Saves, commits, reopens and restores one tensor through an installed ckptdb. */
#include <ckptdb/ckptdb.h>
#include <stdio.h>
#include <string.h>

#define CHECK(call)                                                                         \
  do {                                                                                      \
    int rc_ = (call);                                                                       \
    if (rc_ != CKPTDB_OK) {                                                                 \
      fprintf(stderr, "%s: %s: %s\n", #call, ckptdb_status_name(rc_), ckptdb_last_error()); \
      return 1;                                                                             \
    }                                                                                       \
  } while (0)

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  char tiers[4096];
  snprintf(tiers, sizeof tiers, "disk:%s/tier", argv[1]);
  ckptdb_options o;
  ckptdb_options_init(&o);
  o.root = argv[1];
  o.tiers = tiers;
  o.rank = 0;
  o.world_size = 1;
  ckptdb* db = NULL;
  float w[1000];
  for (int i = 0; i < 1000; ++i) w[i] = (float)i * 0.5f;
  ckptdb_tensor_info info;
  memset(&info, 0, sizeof info);
  info.dtype = CKPTDB_DTYPE_F32;
  info.ndim = 1;
  info.shape[0] = 1000;
  CHECK(ckptdb_open(&o, &db));
  CHECK(ckptdb_put_shard(db, 1, "w", w, sizeof w, &info, 0));
  CHECK(ckptdb_commit(db, 1, 0));
  CHECK(ckptdb_close(db));
  CHECK(ckptdb_open(&o, &db));
  uint64_t v = 0;
  CHECK(ckptdb_latest(db, &v));
  float r[1000];
  CHECK(ckptdb_restore(db, v, "w", r, sizeof r, 0));
  CHECK(ckptdb_close(db));
  if (v != 1 || memcmp(w, r, sizeof w) != 0) {
    fprintf(stderr, "restored data differs\n");
    return 1;
  }
  printf("consumer ok\n");
  return 0;
}
