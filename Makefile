# ttd: build, test and demo. `make` builds; `make test` installs dependencies, builds and runs
# every suite plus an ASan/UBSan build of them; `make demo` runs the main job through a real ttd.

BUILD ?= build
# The test target builds on every core.
NPROC := $(shell nproc 2>/dev/null || echo 2)
SAN ?= 0
CC ?= gcc
PKGS := grpc libprotobuf-c libevent zlib jansson libcrypto libsystemd

OPT := -O2
ifeq ($(SAN),1)
  OPT := -O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
  SAN_LDFLAGS := -fsanitize=address,undefined
endif
# FUZZ=1 (set by `make fuzz` with CC=clang): every object carries libFuzzer's coverage
# instrumentation besides ASan and UBSan; harnesses link -fsanitize=fuzzer.
ifeq ($(FUZZ),1)
  OPT := -O1 -fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
  SAN_LDFLAGS := -fsanitize=address,undefined
endif

# Include folders are the layers' roots, and each program sees only the layers below it:
# the shared runtime (daemon/runtime/, over kernels/ and the generated protocol) is all that
# libttclient, ttctl and the tools reach; the server's folders (daemon/*/) are for ttd alone.
# scripts/check-layers (run by `make test`) fails on an include that crosses a layer.
VERSION := 1.0.0
CFLAGS := -std=gnu11 $(OPT) -g -fPIC -Wall -Wextra -Wno-unused-parameter -DNOMINMAX -MMD -MP -DTTD_VERSION='"$(VERSION)"' \
  $(shell pkg-config --cflags $(PKGS) check 2>/dev/null)
RUNTIME_INC := -I$(BUILD)/gen -Iproto -Ikernels -Idaemon/runtime
SERVER_INC := $(RUNTIME_INC) -Idaemon
CLIENT_INC := $(RUNTIME_INC) -Iclient -Iclient/include
TEST_INC := $(SERVER_INC) -Iclient -Iclient/include -Itests -Itests/harness
LDFLAGS := $(SAN_LDFLAGS)
GRPC_LIBS := $(shell pkg-config --libs grpc libprotobuf-c zlib jansson libcrypto 2>/dev/null) -lpthread -lm
EVENT_LIBS := $(shell pkg-config --libs libevent 2>/dev/null)
CHECK_LIBS := $(shell pkg-config --libs check 2>/dev/null)
SYSTEMD_LIBS := $(shell pkg-config --libs libsystemd 2>/dev/null)

PROTO := proto/ttd/v1/ttd.proto
GEN_C := $(BUILD)/gen/ttd/v1/ttd.pb-c.c
GEN_H := $(BUILD)/gen/ttd/v1/ttd.pb-c.h
PY_GEN := $(BUILD)/py/ttd/v1/ttd_pb2.py

tree = $(shell find $(1) -name '*.c' | sort)
KERNEL_SRC := $(call tree,kernels)
# The shared runtime: libttruntime.a, linked by ttd, libttclient, ttctl and the tools.
RUNTIME_SRC := $(call tree,daemon/runtime)
# The server: every folder of daemon/ but the runtime.
SERVER_SRC := $(filter-out daemon/service/main.c,$(filter-out daemon/runtime/%,$(call tree,daemon)))
CLIENT_SRC := $(filter-out client/tools/% client/examples/% client/parallel/%,$(call tree,client))
# tests/mpi/: programs mpirun starts for the e2e_parallel suite, linked with MPI, not check_ttd.
TEST_SRC := $(filter-out tests/fuzz/% tests/mpi/%,$(call tree,tests))

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))
GEN_OBJ := $(BUILD)/obj/gen/ttd.pb-c.o
RUNTIME_OBJ := $(call obj,$(RUNTIME_SRC) $(KERNEL_SRC)) $(GEN_OBJ)
SERVER_OBJ := $(call obj,$(SERVER_SRC))
CLIENT_OBJ := $(call obj,$(CLIENT_SRC))
TEST_OBJ := $(call obj,$(TEST_SRC))
LIB_RT := $(BUILD)/lib/libttruntime.a

$(call obj,$(RUNTIME_SRC) $(KERNEL_SRC)): LAYER_INC := $(RUNTIME_INC)
$(SERVER_OBJ) $(BUILD)/obj/daemon/service/main.o: LAYER_INC := $(SERVER_INC)
$(CLIENT_OBJ): LAYER_INC := $(CLIENT_INC)
$(TEST_OBJ) $(call obj,$(call tree,tests/fuzz)): LAYER_INC := $(TEST_INC)

# libttparallel (client/parallel/, header client/include/ttparallel.h): data-parallel training
# over Open MPI, beside libttclient, which stays free of MPI. It sees only ttclient.h and MPI.
MPI_CFLAGS := $(shell pkg-config --cflags ompi-c 2>/dev/null)
MPI_LIBS := $(shell pkg-config --libs ompi-c 2>/dev/null)
PAR_SRC := $(call tree,client/parallel)
PAR_OBJ := $(call obj,$(PAR_SRC))
$(PAR_OBJ): LAYER_INC := -Iclient/include $(MPI_CFLAGS)
LIB_PAR_A := $(BUILD)/lib/libttparallel.a
LIB_PAR_SO := $(BUILD)/lib/libttparallel.so
# The programs that link it: the data-parallel MLP example and the e2e_parallel suite's worker.
MPI_BIN := $(BUILD)/bin/mlp_dp $(BUILD)/bin/dp_worker

TTD := $(BUILD)/bin/ttd
LIB_A := $(BUILD)/lib/libttclient.a
LIB_SO := $(BUILD)/lib/libttclient.so
EXAMPLES := $(patsubst client/examples/%.c,$(BUILD)/bin/%,$(filter-out %_dp.c,$(wildcard client/examples/*.c)))
CHECK := $(BUILD)/bin/check_ttd

# Fuzz harnesses (tests/fuzz/fuzz_NAME.c, each an LLVMFuzzerTestOneInput) and their seed
# corpora (tests/fuzz/corpus/NAME/). They link the daemon with tests/fuzz/fuzz_random.c in
# place of daemon/runtime/base/random.c: deterministic handles, so that every input replays exactly.
FUZZ_HARNESSES := rpc upload compile config tokens admin_http shm_socket h2_frames call_lane
FUZZ_SUPPORT_OBJ := $(call obj,tests/fuzz/fuzz_core.c tests/fuzz/fuzz_random.c tests/fuzz/fuzz_proto_mutate.c)
FUZZ_DAEMON_OBJ := $(SERVER_OBJ) $(filter-out $(BUILD)/obj/daemon/runtime/base/random.o,$(RUNTIME_OBJ))
FUZZ_REPLAY := $(patsubst %,$(BUILD)/bin/fuzz_replay_%,$(FUZZ_HARNESSES))
.SECONDARY: $(call obj,$(wildcard tests/fuzz/*.c)) # kept, though only pattern rules name them

.PHONY: all deps check-layers test test-unit test-asan demo clean install bench bench-deps bench-bin fuzz fuzz-deps fuzz-bin fuzz-replay fuzz-corpus
all: $(TTD) $(LIB_RT) $(LIB_A) $(LIB_SO) $(LIB_PAR_A) $(LIB_PAR_SO) $(EXAMPLES) $(MPI_BIN) $(CHECK) $(PY_GEN) $(BUILD)/bin/ttctl $(FUZZ_REPLAY)

deps:
	@scripts/install-deps.sh

$(GEN_C) $(GEN_H): $(PROTO)
	@mkdir -p $(BUILD)/gen
	protoc-c --proto_path=proto --c_out=$(BUILD)/gen $(PROTO)

$(PY_GEN): $(PROTO)
	@mkdir -p $(BUILD)/py
	protoc --proto_path=proto --python_out=$(BUILD)/py $(PROTO)

$(GEN_OBJ): $(GEN_C)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(RUNTIME_INC) -c $< -o $@

# The kernels stay at -O2 in the sanitizer builds (still instrumented): at -O1 a micro-kernel's
# vector accumulators live on the instrumented stack and a matmul runs some 25 times slower.
ifeq ($(SAN),1)
$(BUILD)/obj/kernels/%.o: CFLAGS += -O2
endif

$(BUILD)/obj/%.o: %.c $(GEN_H)
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	@$(CC) $(CFLAGS) $(LAYER_INC) -c $< -o $@

$(LIB_RT): $(RUNTIME_OBJ)
	@mkdir -p $(dir $@)
	@echo "  AR      $@"
	@rm -f $@ && ar rcs $@ $^

$(TTD): $(SERVER_OBJ) $(BUILD)/obj/daemon/service/main.o $(LIB_RT)
	@mkdir -p $(dir $@)
	@echo "  LINK    $@"
	@$(CC) $(LDFLAGS) $^ $(GRPC_LIBS) $(EVENT_LIBS) $(SYSTEMD_LIBS) -o $@

# libttclient.a carries the runtime's objects too: a program links this one archive.
$(LIB_A): $(CLIENT_OBJ) $(RUNTIME_OBJ)
	@mkdir -p $(dir $@)
	@echo "  AR      $@"
	@rm -f $@ && ar rcs $@ $^

$(LIB_SO): $(CLIENT_OBJ) $(RUNTIME_OBJ) client/libttclient.map
	@mkdir -p $(dir $@)
	@echo "  LINK    $@"
	@$(CC) -shared $(LDFLAGS) -Wl,-soname,libttclient.so.1 -Wl,--version-script,client/libttclient.map \
	  $(CLIENT_OBJ) $(RUNTIME_OBJ) $(GRPC_LIBS) -o $@.1
	@ln -sf libttclient.so.1 $@

$(BUILD)/bin/%: client/examples/%.c client/examples/train_common.h $(LIB_A)
	@mkdir -p $(dir $@)
	@echo "  LINK    $@"
	@$(CC) $(filter-out -MMD -MP,$(CFLAGS)) -Iclient/include $(LDFLAGS) $< $(LIB_A) $(GRPC_LIBS) -o $@

$(LIB_PAR_A): $(PAR_OBJ)
	@mkdir -p $(dir $@)
	@echo "  AR      $@"
	@rm -f $@ && ar rcs $@ $^

$(LIB_PAR_SO): $(PAR_OBJ) $(LIB_SO) client/libttparallel.map
	@mkdir -p $(dir $@)
	@echo "  LINK    $@"
	@$(CC) -shared $(LDFLAGS) -Wl,-soname,libttparallel.so.1 -Wl,--version-script,client/libttparallel.map \
	  $(PAR_OBJ) -L$(BUILD)/lib -lttclient $(MPI_LIBS) -lpthread -o $@.1
	@ln -sf libttparallel.so.1 $@

# mlp_dp: mlp's data-parallel mode (mlp execs it when started under mpirun with 2 ranks or more).
$(BUILD)/bin/mlp_dp: client/examples/mlp_dp.c client/examples/train_common.h $(LIB_PAR_A) $(LIB_A)
$(BUILD)/bin/dp_worker: tests/mpi/dp_worker.c $(LIB_PAR_A) $(LIB_A)
$(MPI_BIN):
	@mkdir -p $(dir $@)
	@echo "  LINK    $@"
	@$(CC) $(filter-out -MMD -MP,$(CFLAGS)) -Iclient/include $(MPI_CFLAGS) $(LDFLAGS) $< $(LIB_PAR_A) $(LIB_A) \
	  $(MPI_LIBS) $(GRPC_LIBS) -o $@

# ttctl, the operator's tool: the public client API plus the runtime's token and config code.
TTCTL_SRC := $(wildcard client/tools/*.c)
TOOL_CFLAGS = $(filter-out -MMD -MP,$(CFLAGS)) $(RUNTIME_INC) -Iclient/include
$(BUILD)/bin/ttctl: $(TTCTL_SRC) $(wildcard client/tools/*.h) $(LIB_A)
	@mkdir -p $(dir $@)
	@echo "  LINK    $@"
	@$(CC) $(TOOL_CFLAGS) $(LDFLAGS) $(TTCTL_SRC) $(LIB_A) $(GRPC_LIBS) -o $@

$(CHECK): $(TEST_OBJ) $(SERVER_OBJ) $(LIB_A)
	@mkdir -p $(dir $@)
	@echo "  LINK    $@"
	@$(CC) $(LDFLAGS) -Wl,--wrap=calloc $(TEST_OBJ) $(SERVER_OBJ) $(LIB_A) $(CHECK_LIBS) $(GRPC_LIBS) $(EVENT_LIBS) \
	  $(SYSTEMD_LIBS) -o $@

# The suites find the daemon, the generated Python code and the tests folder through these.
TEST_ENV = TTD_BIN=$(abspath $(BUILD))/bin/ttd TTD_PY_GEN=$(abspath $(BUILD))/py TTD_TESTS_DIR=$(abspath tests)

test-unit: all
	$(TEST_ENV) scripts/run-suites $(CHECK)
	$(MAKE) --no-print-directory fuzz-replay

# The sanitizer run leaves out what only the plain run needs to show (TTD_SKIP_HUGE): the 2 GiB
# transfer, two concurrent epochs of training and the bounds on peak memory under a stream
# flood and pipelined admin requests (ASan's quarantine keeps what is freed); the demo's
# epoch goes in batches of 256.
test-asan:
	$(MAKE) -j$(NPROC) BUILD=$(BUILD)/asan SAN=1 all
	TTD_SKIP_HUGE=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 LSAN_OPTIONS=suppressions=$(abspath tests/lsan.supp) \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  $(MAKE) --no-print-directory BUILD=$(BUILD)/asan SAN=1 test-unit

# Every include points down the stack (the layers of scripts/check-layers).
check-layers:
	@scripts/check-layers

# The Python package (client/python, `import ttd.torch`): its pytest suites with Debian's
# python3 and torch, against libttclient.so of this build and a real ttd.
.PHONY: test-python
test-python: all
	TTD_BIN=$(abspath $(BUILD))/bin/ttd TTD_LIB=$(abspath $(BUILD))/lib/libttclient.so \
	  /usr/bin/python3 -m pytest -q -p no:cacheprovider client/python/tests

# Every code block of README.md and docs/ compiled or run against this build and a real ttd.
.PHONY: check-docs
check-docs: all
	scripts/check-docs $(BUILD)

test: deps
	$(MAKE) check-layers
	$(MAKE) -j$(NPROC) all
	$(MAKE) test-unit
	$(MAKE) --no-print-directory test-python
	$(MAKE) --no-print-directory check-docs
	$(MAKE) test-asan
	$(MAKE) --no-print-directory faults-short

demo: deps
	$(MAKE) all
	scripts/demo.sh $(BUILD)

# make bench: scripts/bench/bench runs every bench program against this build's ttd
# and writes $(BUILD)/bench/results.json. The programs are not part of `all`: they link
# OpenBLAS (the sgemm reference, bench only), which `make test` must not need. $(LIB_A)
# holds the kernels (ttd_k_matmul, ttd_pool) bench_matmul measures.
BENCH_BIN := $(patsubst %,$(BUILD)/bin/bench_%,peak transfer rpc matmul train sessions restart dp step_ab)
BENCH_LIB_SRC := scripts/bench/bench_common.c scripts/bench/bench_bare_grpc.c scripts/bench/bench_mlp.c
BENCH_CFLAGS = $(TOOL_CFLAGS) -I. $(shell pkg-config --cflags openblas 2>/dev/null)
BENCH_LIBS = $(shell pkg-config --libs openblas 2>/dev/null || echo -lopenblas)

$(BUILD)/bin/bench_%: scripts/bench/bench_%.c $(BENCH_LIB_SRC) $(wildcard scripts/bench/*.h) $(LIB_A)
	@mkdir -p $(dir $@)
	@echo "  LINK    $@"
	@$(CC) $(BENCH_CFLAGS) $(LDFLAGS) $< $(BENCH_LIB_SRC) $(LIB_A) $(BENCH_LIBS) $(GRPC_LIBS) -o $@

# bench_dp runs under mpirun: libttparallel and MPI besides.
$(BUILD)/bin/bench_dp: scripts/bench/bench_dp.c $(BENCH_LIB_SRC) $(wildcard scripts/bench/*.h) $(LIB_PAR_A) $(LIB_A)
	@mkdir -p $(dir $@)
	@echo "  LINK    $@"
	@$(CC) $(BENCH_CFLAGS) $(MPI_CFLAGS) $(LDFLAGS) $< $(BENCH_LIB_SRC) $(LIB_PAR_A) $(LIB_A) $(BENCH_LIBS) $(MPI_LIBS) \
	  $(GRPC_LIBS) -o $@

bench-deps:
	@scripts/install-deps.sh --bench

bench-bin: $(BENCH_BIN)

bench: bench-deps
	$(MAKE) --no-print-directory all bench-bin
	scripts/bench/bench $(BUILD)

# The corpus replay of `make test`: each harness built with $(CC) and a main that runs every
# file of tests/fuzz/corpus/NAME through it once (in the ASan/UBSan build under test-asan).
# A crash, a sanitizer report or an accounting leak fails it.
$(BUILD)/bin/fuzz_replay_%: $(BUILD)/obj/tests/fuzz/fuzz_%.o $(BUILD)/obj/tests/fuzz/replay_main.o $(FUZZ_SUPPORT_OBJ) $(FUZZ_DAEMON_OBJ)
	@mkdir -p $(dir $@)
	@echo "  LINK    $@"
	@$(CC) $(LDFLAGS) $^ $(GRPC_LIBS) $(EVENT_LIBS) $(SYSTEMD_LIBS) -o $@

fuzz-replay: $(FUZZ_REPLAY)
	@for h in $(FUZZ_HARNESSES); do $(BUILD)/bin/fuzz_replay_$$h tests/fuzz/corpus/$$h || exit 1; done

# Rewrites the seed-* files of tests/fuzz/corpus/ (crash-* regression inputs stay).
fuzz-corpus: $(PY_GEN)
	PYTHONPATH=$(BUILD)/py tests/fuzz/make_corpus.py tests/fuzz/corpus

# make fuzz: the harnesses built with clang's libFuzzer, ASan and UBSan into
# $(BUILD)/fuzz, each run for FUZZ_SECONDS from its seed corpus; execs and crashes per
# harness go to $(BUILD)/fuzz/summary.txt, crashing inputs to $(BUILD)/fuzz/artifacts/.
# Needs clang and libFuzzer (scripts/install-deps.sh --fuzz), which `make test` does not.
FUZZ_SECONDS ?= 60
FUZZ_DIR := $(BUILD)/fuzz

$(BUILD)/bin/fuzz_%: $(BUILD)/obj/tests/fuzz/fuzz_%.o $(FUZZ_SUPPORT_OBJ) $(FUZZ_DAEMON_OBJ)
	@mkdir -p $(dir $@)
	@echo "  LINK    $@"
	@$(CC) -fsanitize=fuzzer $(LDFLAGS) $^ $(GRPC_LIBS) $(EVENT_LIBS) $(SYSTEMD_LIBS) -o $@

fuzz-bin: $(patsubst %,$(BUILD)/bin/fuzz_%,$(FUZZ_HARNESSES))

fuzz-deps:
	@scripts/install-deps.sh --fuzz

fuzz: fuzz-deps
	$(MAKE) --no-print-directory BUILD=$(FUZZ_DIR) CC=clang FUZZ=1 fuzz-bin
	tests/fuzz/run_fuzz.sh $(FUZZ_DIR) $(FUZZ_SECONDS) $(FUZZ_HARNESSES)

clean:
	rm -rf $(BUILD)

# make install: PREFIX (default /usr/local) and DESTDIR as usual. The unit file goes to
# /lib/systemd/system with ExecStart pointing into PREFIX; an existing /etc/ttd/ttd.conf is kept.
PREFIX ?= /usr/local
TTCLIENT_VERSION := $(VERSION)
INSTALL_GEN := $(BUILD)/install
# The Python package ttd (`import ttd.torch`), its .py files only, where Debian's /usr/bin/python3
# looks: /usr/lib/python3/dist-packages for PREFIX=/usr, else PREFIX/lib/python3.X/dist-packages
# (Debian's site.py adds /usr/local/lib/python3.X/dist-packages, not .../python3/...).
PY_VERSION := $(shell /usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
PYTHONDIR ?= $(if $(filter /usr,$(PREFIX)),$(PREFIX)/lib/python3/dist-packages,$(PREFIX)/lib/python$(PY_VERSION)/dist-packages)

install: $(TTD) $(LIB_A) $(LIB_SO) $(LIB_PAR_A) $(LIB_PAR_SO) $(BUILD)/bin/ttctl
	@mkdir -p $(INSTALL_GEN)
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(TTCLIENT_VERSION)|g' client/ttclient.pc.in > $(INSTALL_GEN)/ttclient.pc
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(TTCLIENT_VERSION)|g' client/ttparallel.pc.in > $(INSTALL_GEN)/ttparallel.pc
	sed -e 's|^ExecStart=/usr/local/bin/ttd|ExecStart=$(PREFIX)/bin/ttd|' scripts/ttd.service > $(INSTALL_GEN)/ttd.service
	install -D -m 0755 $(TTD) $(DESTDIR)$(PREFIX)/bin/ttd
	install -D -m 0755 $(BUILD)/bin/ttctl $(DESTDIR)$(PREFIX)/bin/ttctl
	install -D -m 0644 $(LIB_A) $(DESTDIR)$(PREFIX)/lib/libttclient.a
	install -D -m 0755 $(LIB_SO).1 $(DESTDIR)$(PREFIX)/lib/libttclient.so.1
	ln -sfn libttclient.so.1 $(DESTDIR)$(PREFIX)/lib/libttclient.so
	install -D -m 0644 client/include/ttclient.h $(DESTDIR)$(PREFIX)/include/ttclient.h
	install -D -m 0644 $(LIB_PAR_A) $(DESTDIR)$(PREFIX)/lib/libttparallel.a
	install -D -m 0755 $(LIB_PAR_SO).1 $(DESTDIR)$(PREFIX)/lib/libttparallel.so.1
	ln -sfn libttparallel.so.1 $(DESTDIR)$(PREFIX)/lib/libttparallel.so
	install -D -m 0644 client/include/ttparallel.h $(DESTDIR)$(PREFIX)/include/ttparallel.h
	install -D -m 0644 $(INSTALL_GEN)/ttparallel.pc $(DESTDIR)$(PREFIX)/lib/pkgconfig/ttparallel.pc
	install -D -m 0644 docs/man/ttd.8 $(DESTDIR)$(PREFIX)/share/man/man8/ttd.8
	install -D -m 0644 docs/man/ttctl.8 $(DESTDIR)$(PREFIX)/share/man/man8/ttctl.8
	install -D -m 0644 $(INSTALL_GEN)/ttclient.pc $(DESTDIR)$(PREFIX)/lib/pkgconfig/ttclient.pc
	install -D -m 0644 $(INSTALL_GEN)/ttd.service $(DESTDIR)/lib/systemd/system/ttd.service
	install -D -m 0644 scripts/ttd.sysusers $(DESTDIR)/usr/lib/sysusers.d/ttd.conf
	if [ ! -e $(DESTDIR)/etc/ttd/ttd.conf ]; then install -D -m 0644 scripts/ttd.conf $(DESTDIR)/etc/ttd/ttd.conf; fi
	install -d -m 0755 $(DESTDIR)$(PYTHONDIR)/ttd
	install -m 0644 $(wildcard client/python/ttd/*.py) $(DESTDIR)$(PYTHONDIR)/ttd/

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)

# scripts/faults and scripts/soak: the fault and soak drivers, built from
# scripts/faults-src/ with libttclient, the daemon's token helpers (for the --tokens file)
# and the bench's statistics and MLP step. `make faults-short` is the short fault suite
# for CI (under a minute); `make faults` the full run, `make soak SOAK_SECONDS=N` the soak.
FAULTS_SRC := $(wildcard scripts/faults-src/ft_*.c scripts/faults-src/fc_*.c scripts/faults-src/faults_*.c) \
  scripts/bench/bench_common.c scripts/bench/bench_mlp.c
FAULTS_CFLAGS = $(TOOL_CFLAGS) -I. -Iscripts/faults-src

$(BUILD)/bin/ttd_faults: $(FAULTS_SRC) $(wildcard scripts/faults-src/*.h scripts/bench/*.h) $(LIB_A)
	@mkdir -p $(dir $@)
	@echo "  LINK    $@"
	@$(CC) $(FAULTS_CFLAGS) $(LDFLAGS) $(FAULTS_SRC) $(LIB_A) $(GRPC_LIBS) -o $@

.PHONY: faults-bin faults-short faults
faults-bin: $(TTD) $(BUILD)/bin/ttd_faults

faults-short: faults-bin
	scripts/faults --short $(BUILD)

faults: faults-bin
	scripts/faults $(BUILD)

SOAK_SRC := $(wildcard scripts/soak-src/*.c) scripts/faults-src/ft_daemon.c scripts/faults-src/ft_metrics.c \
  scripts/faults-src/ft_proc.c scripts/bench/bench_common.c scripts/bench/bench_mlp.c

$(BUILD)/bin/ttd_soak: $(SOAK_SRC) $(wildcard scripts/soak-src/*.h scripts/faults-src/*.h scripts/bench/*.h) $(LIB_A)
	@mkdir -p $(dir $@)
	@echo "  LINK    $@"
	@$(CC) $(FAULTS_CFLAGS) -Iscripts/soak-src $(LDFLAGS) $(SOAK_SRC) $(LIB_A) $(GRPC_LIBS) -o $@

.PHONY: soak-bin
soak-bin: $(TTD) $(BUILD)/bin/ttd_soak

SOAK_SECONDS ?= 120
.PHONY: soak
soak: soak-bin
	scripts/soak $(SOAK_SECONDS) $(BUILD)

# make valgrind: the end-to-end suites with every ttd they start under memcheck
# (scripts/valgrind-e2e --client puts the test process under it too); BUILD/valgrind/
# summary.txt gets the processes, errors and definitely lost bytes. Long (tens of minutes):
# not part of `make test`.
.PHONY: valgrind
valgrind:
	@scripts/install-deps.sh --valgrind
	$(MAKE) --no-print-directory all
	scripts/valgrind-e2e $(BUILD)
