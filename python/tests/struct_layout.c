/* Prints the offsets and sizes of the C API's structures that python/ckptdb/_capi.py mirrors with
 * ctypes, so its test can check the mirror against the header as the C compiler lays it out. */
#include <stddef.h>
#include <stdio.h>

#include "ckptdb/ckptdb.h"

#define FIELD(type, field) printf("%s.%s %zu\n", #type, #field, offsetof(type, field))

int main(void) {
  printf("ckptdb_options %zu\n", sizeof(ckptdb_options));
  FIELD(ckptdb_options, root);
  FIELD(ckptdb_options, tiers);
  FIELD(ckptdb_options, commit_tier);
  FIELD(ckptdb_options, backpressure);
  FIELD(ckptdb_options, rank);
  FIELD(ckptdb_options, world_size);
  FIELD(ckptdb_options, node_id);
  FIELD(ckptdb_options, coordinator);
  FIELD(ckptdb_options, redundancy);
  FIELD(ckptdb_options, job_token);
  FIELD(ckptdb_options, staging_bytes);
  FIELD(ckptdb_options, chunk_bytes);
  FIELD(ckptdb_options, queue_depth);
  FIELD(ckptdb_options, capture_threads);
  FIELD(ckptdb_options, read_only);
  FIELD(ckptdb_options, create_if_missing);
  FIELD(ckptdb_options, drain_on_close);
  FIELD(ckptdb_options, cpus);
  FIELD(ckptdb_options, drop_tiers);
  FIELD(ckptdb_options, device);
  printf("ckptdb_tensor_info %zu\n", sizeof(ckptdb_tensor_info));
  FIELD(ckptdb_tensor_info, dtype);
  FIELD(ckptdb_tensor_info, ndim);
  FIELD(ckptdb_tensor_info, shape);
  FIELD(ckptdb_tensor_info, global_shape);
  FIELD(ckptdb_tensor_info, global_offset);
  printf("ckptdb_shard %zu\n", sizeof(ckptdb_shard));
  FIELD(ckptdb_shard, name);
  FIELD(ckptdb_shard, data);
  FIELD(ckptdb_shard, nbytes);
  FIELD(ckptdb_shard, info);
  FIELD(ckptdb_shard, flags);
  printf("ckptdb_tensor_desc %zu\n", sizeof(ckptdb_tensor_desc));
  FIELD(ckptdb_tensor_desc, name);
  FIELD(ckptdb_tensor_desc, dtype);
  FIELD(ckptdb_tensor_desc, ndim);
  FIELD(ckptdb_tensor_desc, shape);
  FIELD(ckptdb_tensor_desc, global_shape);
  FIELD(ckptdb_tensor_desc, global_offset);
  FIELD(ckptdb_tensor_desc, nbytes);
  FIELD(ckptdb_tensor_desc, chunk_count);
  FIELD(ckptdb_tensor_desc, kept_bytes);
  FIELD(ckptdb_tensor_desc, parity_chunks);
  FIELD(ckptdb_tensor_desc, parity_bytes);
  FIELD(ckptdb_tensor_desc, recomputed);
  printf("ckptdb_box %zu\n", sizeof(ckptdb_box));
  FIELD(ckptdb_box, ndim);
  FIELD(ckptdb_box, offset);
  FIELD(ckptdb_box, shape);
  return 0;
}
