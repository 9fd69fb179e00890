# OpenMesh: a thin wrapper around CMake. `make up` runs the mesh on its
# embedded default; `make check` runs every test (sanitized when CI=true).

JOBS ?= $(shell nproc 2>/dev/null || echo 2)

ifeq ($(CI),true)
BUILD ?= build-ci
CMAKE_FLAGS += -DOPENMESH_SANITIZE=ON -DOPENMESH_WERROR=ON -DCMAKE_BUILD_TYPE=Debug
else
BUILD ?= build
endif
BENCH_BUILD ?= build-bench

# Run Lua (busted) against the module just built (--cpath wins over .busted,
# and busted re-executes under --lua, so each path is one entry, no ';'). A sanitized module needs
# the sanitizer runtimes loaded first into the stock interpreter.
LUA_ENV = LUA_PATH="$(CURDIR)/lua/?.lua;$(CURDIR)/lua/?/init.lua;;" \
          LUA_CPATH="$(CURDIR)/$(BUILD)/lib/?.so;;" \
          OPENMESH_BIN="$(CURDIR)/$(BUILD)/bin/openmesh"
ifeq ($(CI),true)
LUA_ENV += LD_PRELOAD="$(shell gcc -print-file-name=libasan.so) $(shell gcc -print-file-name=libubsan.so)" \
           ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
endif

.PHONY: all build deps deps-bench sdk-deps check format-check test-c test-lua bench format clean up fuzz

all: build

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

# What building and testing need (scripts/deps); the benchmark peers
# (nginx, haproxy, wrk) only for `make bench` (scripts/deps-bench).
deps:
	scripts/deps

deps-bench:
	scripts/deps-bench

# The official SDKs spec/03-integration/sdk_spec.lua drives (npm packages
# pinned by tests/sdk/package-lock.json, installed into tests/sdk/
# node_modules, never globally); again only when the lock file changed.
tests/sdk/node_modules/.package-lock.json: tests/sdk/package-lock.json
	cd tests/sdk && npm ci --no-audit --no-fund --loglevel=error
sdk-deps: tests/sdk/node_modules/.package-lock.json

# The embedded default: a control plane and the example services of
# examples/up.json on loopback. Ctrl-C stops it.
up: deps
	$(MAKE) --no-print-directory build
	$(BUILD)/bin/openmesh up examples

check: deps
	$(MAKE) --no-print-directory format-check
	$(MAKE) build
	$(MAKE) --no-print-directory sdk-deps
	@c=0; l=0; \
	$(MAKE) --no-print-directory test-c || c=1; \
	$(MAKE) --no-print-directory test-lua || l=1; \
	if [ $$c -ne 0 ] || [ $$l -ne 0 ]; then \
	  echo "make check: FAILED (C tests: $$([ $$c -eq 0 ] && echo ok || echo failed), Lua specs: $$([ $$l -eq 0 ] && echo ok || echo failed))"; \
	  exit 1; fi; \
	echo "make check: all C tests and Lua specs passed"

test-c:
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The specs run twice: with stock lua5.4 loading the module, and inside the
# openmesh binary's embedded runtime (`openmesh test`), as policy authors may.
test-lua:
	$(LUA_ENV) busted --lua=lua5.4 --lpath="$(CURDIR)/lua/?.lua" \
	  --cpath="$(CURDIR)/$(BUILD)/lib/?.so" spec
	OPENMESH_BIN="$(CURDIR)/$(BUILD)/bin/openmesh" $(BUILD)/bin/openmesh test spec/01-unit spec/02-policy

bench: deps deps-bench
	cmake -S . -B $(BENCH_BUILD) -DCMAKE_BUILD_TYPE=Release
	cmake --build $(BENCH_BUILD) -j $(JOBS)
	@for b in $(BENCH_BUILD)/bench/bench_*; do \
	  [ -x "$$b" ] || continue; "$$b" || exit 1; done
	bash bench/proxy_bench.sh $(BENCH_BUILD)/bin/openmesh
	/usr/bin/python3 bench/ws_echo_bench.py $(BENCH_BUILD)/bin/openmesh
	bash bench/stream_bench.sh $(BENCH_BUILD)/bin/openmesh
	/usr/bin/python3 bench/failover_bench.py $(BENCH_BUILD)/bin/openmesh
	bash bench/names_bench.sh $(BENCH_BUILD)/bin/openmesh
	bash bench/handshake_bench.sh $(BENCH_BUILD)/bin/openmesh
	bash bench/tls_bench.sh $(BENCH_BUILD)/bin/openmesh
	/usr/bin/python3 bench/topology_bench.py $(BENCH_BUILD)/bin/openmesh
	bash bench/pool_bench.sh $(BENCH_BUILD)/bin/openmesh
	bash bench/body_bench.sh $(BENCH_BUILD)/bin/openmesh
	bash bench/fleet_bench.sh $(BENCH_BUILD)/bin/openmesh
	bash bench/access_log_bench.sh $(BENCH_BUILD)/bin/openmesh
	bash bench/h2_bench.sh $(BENCH_BUILD)/bin/openmesh
	bash bench/egress_gateway_bench.sh $(BENCH_BUILD)/bin/openmesh
	/usr/bin/python3 bench/watch_bench.py $(BENCH_BUILD)/bin/openmesh

# The HTTP/1.1 framing module against http-parser on many generated
# messages (make check runs a few thousand). OM_FUZZ_SEED=N replays a run;
# the seed is printed first.
OM_FUZZ_COUNT ?= 300000
fuzz: build
	OM_FUZZ_COUNT=$(OM_FUZZ_COUNT) $(BUILD)/test_http1_fuzz

format:
	git ls-files '*.c' '*.h' | xargs clang-format -i

# The tree is kept in .clang-format's style: `make format` fixes what this
# finds.
format-check:
	git ls-files '*.c' '*.h' | xargs clang-format --dry-run -Werror

clean:
	rm -rf build build-ci $(BENCH_BUILD)
