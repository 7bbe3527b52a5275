# The README's two commands. Each does its own set-up on a fresh Debian 12 machine (as root):
# install what is missing from Debian's archive, configure, build, then run.
BUILD_DIR ?= build
JOBS ?= 2
CMAKE_FLAGS ?=

.PHONY: all deps configure build demo test check test-asan test-tsan test-cuda test-hip bench fuzz clean install

all: build

deps:
	./scripts/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release -DCKPTDB_WITH_CUDA=OFF $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD_DIR) -j$(JOBS)

# The demo builds only what it runs (the ckptdb command and its library; `make test` builds the
# rest) and says how long the set-up took before it starts.
demo:
	@start=$$(date +%s); \
	./scripts/install-deps.sh && \
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release -DCKPTDB_WITH_CUDA=OFF $(CMAKE_FLAGS) && \
	cmake --build $(BUILD_DIR) -j$(JOBS) --target ckptdb_cli && \
	echo "make demo: set-up (packages, configure, build of ./$(BUILD_DIR)/ckptdb) took $$(( $$(date +%s) - start )) s" && \
	./$(BUILD_DIR)/ckptdb demo

# The contract (.ci/run runs exactly this): the suite, then the suite again under AddressSanitizer
# and UndefinedBehaviorSanitizer, then the threaded tests under ThreadSanitizer, then the CUDA
# variant's build and its tests (docs/testing.md).
# `make check` runs the suite alone, for quick rounds while developing.
test: check test-asan test-tsan test-cuda

check: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j$(JOBS)

# The suite built with AddressSanitizer and UndefinedBehaviorSanitizer (any UBSan finding fails
# the test), in its own build directory: the tests and the CLI only (ckptdb_test_programs), at
# -O1 with line tables only (-g1: what a sanitizer's report needs), which halves the compile of
# a test against -O2 -g (34 s to 16 s for cluster_test.cc on 11-27). Left out: the package
# install test (its consumer is built without the sanitizers) and the Python package's and its
# pip install's (Debian's python3 cannot load an ASan-built libckptdb.so: the runtime must come
# first).
ASAN_BUILD_DIR ?= build-asan
SANITIZE = -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
SANITIZER_OPT = "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
test-asan: deps
	cmake -S . -B $(ASAN_BUILD_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPTDB_BUILD_FUZZERS=OFF \
	  -DCKPTDB_WITH_CUDA=OFF $(SANITIZER_OPT) \
	  "-DCMAKE_CXX_FLAGS=$(SANITIZE)" "-DCMAKE_C_FLAGS=$(SANITIZE)" \
	  "-DCMAKE_EXE_LINKER_FLAGS=$(SANITIZE)" "-DCMAKE_SHARED_LINKER_FLAGS=$(SANITIZE)"
	cmake --build $(ASAN_BUILD_DIR) -j$(JOBS) --target ckptdb_test_programs
	LSAN_OPTIONS="suppressions=$(CURDIR)/tests/lsan.supp" \
	  ctest --test-dir $(ASAN_BUILD_DIR) --output-on-failure -j$(JOBS) \
	  -E '^(install_package|python_package|pip_install)$$'

# The tests whose threads share state (capture workers, the tier manager, readers, the
# transport's progress thread, the coordinator's thread), built with ThreadSanitizer in their
# own build directory; a race stops the run. Tests that fork a process which then starts threads (the cluster and crash
# tests, the ram tier's SIGKILL test) are left out: ThreadSanitizer does not support that. UCX's
# memory hooks are turned off: with them ThreadSanitizer crashes as threads exit. Reports from
# inside RocksDB (Debian's, not built with ThreadSanitizer) are suppressed: tests/tsan.supp.
TSAN_BUILD_DIR ?= build-tsan
TSAN_TESTS = staging_ring_test capture_test tier_manager_test api_test ram_tier_test \
  replica_store_test transport_test fault_test coordinator_test nfs_tier_test interleave_test \
  trust_test device_sim_test
test-tsan: deps
	cmake -S . -B $(TSAN_BUILD_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPTDB_BUILD_FUZZERS=OFF \
	  -DCKPTDB_WITH_CUDA=OFF \
	  "-DCMAKE_CXX_FLAGS=-fsanitize=thread -fno-omit-frame-pointer" \
	  "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread" "-DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread"
	cmake --build $(TSAN_BUILD_DIR) -j$(JOBS) --target $(TSAN_TESTS)
	for t in $(TSAN_TESTS); do \
	  TSAN_OPTIONS="halt_on_error=1 suppressions=$(CURDIR)/tests/tsan.supp" UCX_MEM_EVENTS=no UCX_MEM_MALLOC_HOOKS=no \
	  UCX_MEM_MMAP_HOOK_MODE=none $(TSAN_BUILD_DIR)/tests/$$t --gtest_filter='-*KillNine*' \
	  || exit 1; done

# The CUDA variant (issue 8), built so that it cannot rot where there is no GPU: the library
# with the CUDA backend (io/device_gpu.cc on the CUDA runtime), the C API's, capture's and the
# GPU tests (tests/gpu_test.cu, nvcc), and the GPU benchmark (built, not run). Without a device each GPU test prints why it is
# skipped; with one they run. Without nvcc the target says so and builds nothing.
CUDA_BUILD_DIR ?= build-cuda
NVCC ?= /usr/local/cuda/bin/nvcc
CUDA_TESTS = api_test capture_test gpu_test device_sim_test
test-cuda: deps
	@if [ ! -x $(NVCC) ]; then echo "test-cuda: skipped, no nvcc at $(NVCC)"; exit 0; fi; \
	cmake -S . -B $(CUDA_BUILD_DIR) -DCMAKE_BUILD_TYPE=Release -DCKPTDB_BUILD_FUZZERS=OFF \
	  -DCKPTDB_WITH_CUDA=ON -DCMAKE_CUDA_COMPILER=$(NVCC) && \
	cmake --build $(CUDA_BUILD_DIR) -j$(JOBS) --target $(CUDA_TESTS) bench_gpu_capture && \
	ctest --test-dir $(CUDA_BUILD_DIR) --output-on-failure -j$(JOBS) \
	  -R '^(ApiTest|ApiNames|CaptureTest|GpuTest|DeviceQueueTest|SimStoreTest)\.'

# The HIP variant, by hand (not in `make test`: Debian's hipcc pulls in clang-15 and ROCm's
# device libraries): apt-get install hipcc libamdhip64-dev, then make test-hip. The library with
# the HIP backend (the same io/device_gpu.cc on HIP's runtime), and the C API's and capture's
# tests; the GPU tests' kernels are CUDA's (tests/gpu_test.cu) and are not built here.
HIP_BUILD_DIR ?= build-hip
HIP_TESTS = api_test capture_test
test-hip: deps
	cmake -S . -B $(HIP_BUILD_DIR) -DCMAKE_BUILD_TYPE=Release -DCKPTDB_BUILD_FUZZERS=OFF \
	  -DCKPTDB_WITH_CUDA=OFF -DCKPTDB_WITH_HIP=ON
	cmake --build $(HIP_BUILD_DIR) -j$(JOBS) --target $(HIP_TESTS)
	for t in $(HIP_TESTS); do $(HIP_BUILD_DIR)/tests/$$t || exit 1; done

bench: build
	./bench/run.sh $(BUILD_DIR)

# Longer fuzzing runs by hand: make fuzz FUZZ_SECONDS=600
FUZZ_SECONDS ?= 60
fuzz: build
	./fuzz/run.sh $(BUILD_DIR) $(FUZZ_SECONDS)

install: build
	cmake --install $(BUILD_DIR)

clean:
	rm -rf $(BUILD_DIR)
