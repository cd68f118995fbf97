# A thin wrapper over CMake: `make run` and `make test` do all the set-up on a fresh machine.
#
#   make run       install missing packages, build (Release), run the main job on its defaults
#   make test      the same build with -Werror, all tests; then the CUDA-off build and its tests
#   make sanitize  ASan + UBSan build (no CUDA) and its unit and CLI tests
#   make memcheck  the CLI tests (CUDA-off build) under valgrind memcheck: zero errors, no leaks
#   make fuzz      the libFuzzer harnesses (clang), 70 s in all (scripts/fuzz)
#   make validate  on a GPU machine: calibrate it, then validate the cost model against 8 jobs
#                  (writes $(VALIDATE)/: the profile and the report; also without the profile)
#   make clean     remove the build folders

BUILD        ?= build
BUILD_NOCUDA ?= build-nocuda
BUILD_ASAN   ?= build-asan
JOBS         ?= $(shell nproc)
CMAKE_FLAGS  ?=
MOEPLAN       = ./$(BUILD)/cli/moeplan
VALIDATE     ?= $(BUILD)/validation

.PHONY: all deps build run test test-nocuda sanitize memcheck fuzz validate clean

all: build

deps:
	@scripts/install-deps

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DMOEPLAN_WERROR=ON $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j$(JOBS) >/dev/null

run: build
	$(MOEPLAN) --version
	$(MOEPLAN) check model/*.json topologies/*.json topologies/xml/*.xml
	$(MOEPLAN) model show deepseek-v3
	$(MOEPLAN) topo show gb300-nvl72-x16
	$(MOEPLAN) plan --model deepseek-v3 --cluster gb300-nvl72-x16 --explain -o $(BUILD)/plan.json

test: build
	cd $(BUILD) && ctest --output-on-failure
	$(MAKE) --no-print-directory test-nocuda

test-nocuda: deps
	@cmake -S . -B $(BUILD_NOCUDA) -DCMAKE_BUILD_TYPE=Release -DMOEPLAN_CUDA=OFF -DMOEPLAN_WERROR=ON >/dev/null
	@cmake --build $(BUILD_NOCUDA) -j$(JOBS) >/dev/null
	cd $(BUILD_NOCUDA) && ctest --output-on-failure

sanitize: deps
	@cmake -S . -B $(BUILD_ASAN) -DCMAKE_BUILD_TYPE=Debug -DMOEPLAN_CUDA=OFF -DMOEPLAN_SANITIZE=ON -DMOEPLAN_WERROR=ON >/dev/null
	@cmake --build $(BUILD_ASAN) -j$(JOBS) >/dev/null
	cd $(BUILD_ASAN) && ctest --output-on-failure -L 'unit|cli'

memcheck: test-nocuda
	cd $(BUILD_NOCUDA) && MOEPLAN_CLI_VALGRIND=1 ctest --output-on-failure -L cli

fuzz: deps
	scripts/fuzz 70

validate: build
	mkdir -p $(VALIDATE)
	$(MOEPLAN) calibrate -o $(VALIDATE)/calibration.json
	$(MOEPLAN) validate --calibration $(VALIDATE)/calibration.json -o $(VALIDATE)/with-profile
	$(MOEPLAN) validate -o $(VALIDATE)/datasheet-defaults

clean:
	rm -rf $(BUILD) $(BUILD_NOCUDA) $(BUILD_ASAN)
