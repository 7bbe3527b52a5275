# The README's two commands. Each does its own set-up on a fresh Debian 12 machine (as root):
# install what is missing from Debian's archive, configure, build, then run.
BUILD_DIR ?= build
JOBS ?= 2
CMAKE_FLAGS ?=

.PHONY: all deps configure build demo test bench fuzz clean install

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
