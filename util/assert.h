// Assertions that stay on in release builds (TigerBeetle's TIGER_STYLE): an invariant that does
// not hold means the process is about to corrupt data, and stopping is the safe answer.
#pragma once

#include <cstdio>
#include <cstdlib>

#define CKPTDB_ASSERT(cond)                                                                       \
  do {                                                                                            \
    if (__builtin_expect(!(cond), 0)) {                                                           \
      std::fprintf(stderr, "ckptdb: assertion failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                               \
    }                                                                                             \
  } while (0)
