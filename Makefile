# A thin wrapper over CMake: `make run` and `make test` do all the set-up on a fresh machine.
#
#   make run       install missing packages, build (Release), run the main job on its defaults
#   make test      the same build with -Werror, all tests; then the CUDA-off build and its tests
#   make sanitize  ASan + UBSan build (no CUDA) and its unit and CLI tests
#   make memcheck  the CLI tests (CUDA-off build) under valgrind memcheck: zero errors, no leaks
#   make fuzz      the libFuzzer harnesses (clang), 80 s in all (scripts/fuzz)
#   make validate  on a GPU machine: calibrate it, then validate the cost model against 13 jobs
#                  (writes $(VALIDATE)/: the profile and the report; also without the profile)
#   make clean     remove the build folders

SHELL        := /bin/bash
.SHELLFLAGS  := -eo pipefail -c

BUILD        ?= build
BUILD_NOCUDA ?= build-nocuda
BUILD_ASAN   ?= build-asan
JOBS         ?= $(shell nproc)
CMAKE_FLAGS  ?=
MOEPLAN       = ./$(BUILD)/cli/moeplan
VALIDATE     ?= $(BUILD)/validation

.PHONY: all deps tools build run test test-nocuda sanitize memcheck fuzz validate clean

all: build

deps:
	@scripts/install-deps 2>&1 | scripts/filter-progress '.' 'installing packages'

# CMake's configure prints only its moeplan lines (what was found, whether the executor is built);
# the build prints its progress lines ([ 42%] Building ...). Both as they come (never held back in
# a pipe's buffer), with a "still at work" line where a step runs long (scripts/filter-progress).
CONFIGURE_FILTER = scripts/filter-progress '^-- moeplan|Error|error|Warning' 'configuring'
BUILD_FILTER = scripts/filter-progress '^\[ *[0-9]+%\]|error|warning' 'building'

build: deps
	@echo "moeplan: configuring $(BUILD)/ (CMake, Release)"
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DMOEPLAN_WERROR=ON $(CMAKE_FLAGS) | $(CONFIGURE_FILTER)
	@echo "moeplan: building $(BUILD)/ with $(JOBS) jobs"
	@cmake --build $(BUILD) -j$(JOBS) | $(BUILD_FILTER)
	@test -x $(BUILD)/cli/moeplan

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
	@echo "moeplan: configuring and building $(BUILD_NOCUDA)/ (MOEPLAN_CUDA=OFF: the planner alone)"
	@cmake -S . -B $(BUILD_NOCUDA) -DCMAKE_BUILD_TYPE=Release -DMOEPLAN_CUDA=OFF -DMOEPLAN_WERROR=ON | $(CONFIGURE_FILTER)
	@cmake --build $(BUILD_NOCUDA) -j$(JOBS) | $(BUILD_FILTER)
	@test -x $(BUILD_NOCUDA)/cli/moeplan
	cd $(BUILD_NOCUDA) && ctest --output-on-failure

tools:
	@scripts/install-deps tools 2>&1 | scripts/filter-progress '.' 'installing packages'

sanitize: deps
	@echo "moeplan: configuring and building $(BUILD_ASAN)/ (ASan + UBSan)"
	@cmake -S . -B $(BUILD_ASAN) -DCMAKE_BUILD_TYPE=Debug -DMOEPLAN_CUDA=OFF -DMOEPLAN_SANITIZE=ON -DMOEPLAN_WERROR=ON | $(CONFIGURE_FILTER)
	@cmake --build $(BUILD_ASAN) -j$(JOBS) | $(BUILD_FILTER)
	@test -x $(BUILD_ASAN)/cli/moeplan
	cd $(BUILD_ASAN) && ctest --output-on-failure -L 'unit|cli'

memcheck: tools test-nocuda
	cd $(BUILD_NOCUDA) && MOEPLAN_CLI_VALGRIND=1 ctest --output-on-failure -L cli

fuzz: deps tools
	scripts/fuzz 80

validate: build
	mkdir -p $(VALIDATE)
	$(MOEPLAN) calibrate -o $(VALIDATE)/calibration.json
	$(MOEPLAN) validate --calibration $(VALIDATE)/calibration.json -o $(VALIDATE)/with-profile
	$(MOEPLAN) validate -o $(VALIDATE)/datasheet-defaults

clean:
	rm -rf $(BUILD) $(BUILD_NOCUDA) $(BUILD_ASAN)
