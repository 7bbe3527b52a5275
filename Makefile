# The README's two commands. Each does its own set-up on a fresh Debian 12 machine (as root):
# install what is missing from Debian's archive, configure, build, then run.
BUILD_DIR ?= build
JOBS ?= 2
CMAKE_FLAGS ?=

.PHONY: all deps configure build demo test test-asan bench fuzz clean install

all: build

deps:
	./scripts/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD_DIR) -j$(JOBS)

demo: build
	./$(BUILD_DIR)/ckptdb demo

test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j$(JOBS)

# The suite built with AddressSanitizer and UndefinedBehaviorSanitizer (any UBSan finding fails
# the test), in its own build directory; about 10 minutes to build on 2 cores. The package
# install test is left out: its consumer is built without the sanitizers.
ASAN_BUILD_DIR ?= build-asan
SANITIZE = -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
test-asan: deps
	cmake -S . -B $(ASAN_BUILD_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPTDB_BUILD_FUZZERS=OFF \
	  "-DCMAKE_CXX_FLAGS=$(SANITIZE)" "-DCMAKE_C_FLAGS=$(SANITIZE)" \
	  "-DCMAKE_EXE_LINKER_FLAGS=$(SANITIZE)" "-DCMAKE_SHARED_LINKER_FLAGS=$(SANITIZE)"
	cmake --build $(ASAN_BUILD_DIR) -j$(JOBS)
	ctest --test-dir $(ASAN_BUILD_DIR) --output-on-failure -j$(JOBS) -E '^install_package$$'

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
