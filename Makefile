# SPDX-License-Identifier: Apache-2.0
# ncclshim: `make` builds build/lib/libnccl.so.2 and the tools; `make test` runs every test;
# `make run` runs the benchmark on 4 local ranks. Each target names what is missing.

CUDA_HOME ?= /usr/local/cuda
# The NCCL ABI ncclshim implements: its genuine nccl.h is what the library compiles against,
# and its genuine libnccl.so.2 what the ABI check holds ours against. Both come from NVIDIA's
# PyPI package (tools/fetch_nccl.sh, into the ignored .deps/), unless NCCL_HOME has them.
NCCL_ABI ?= 2.32.3
NCCL_HOME ?= $(CURDIR)/.deps/nccl-$(NCCL_ABI)
NCCL_INC := $(NCCL_HOME)/include
NCCL_LIBDIR := $(NCCL_HOME)/lib
# The CUDA toolkit's older NCCL, where it has one: nothing of its ABI may be lost, and the
# tests compile against its header too.
NCCL_OLD_INC := $(if $(wildcard $(CUDA_HOME)/include/nccl.h),$(CUDA_HOME)/include)
NCCL_OLD_LIBDIR := $(firstword $(foreach d,$(CUDA_HOME)/lib64 $(CUDA_HOME)/lib,\
              $(if $(wildcard $(d)/libnccl.so.2),$(d))))
PREFIX ?= /usr/local
BUILD ?= build
SANITIZE ?=
NRANKS ?= 4

CC ?= gcc
SAN_FLAGS := $(if $(SANITIZE),-fsanitize=$(SANITIZE) -fno-omit-frame-pointer)
CPPFLAGS := -I. -I$(NCCL_INC) -I$(CUDA_HOME)/include -D_GNU_SOURCE
CFLAGS := -std=gnu11 -O2 -g -fPIC -Wall -Wextra -Werror -Wno-deprecated-declarations $(SAN_FLAGS)
# TLS descriptors: a thread-local access is a couple of instructions instead of a call to
# __tls_get_addr (about 10 a collective call), in whatever way the library is loaded.
TLS_DIALECT := $(if $(filter x86_64,$(shell uname -m)),-mtls-dialect=gnu2)
# NCCL_OS_LINUX: as NCCL's own build, so nccl.h declares the Linux-only functions it exports.
LIB_CFLAGS := $(CFLAGS) -fvisibility=hidden $(TLS_DIALECT) -DNCCL_OS_LINUX
LDFLAGS := $(SAN_FLAGS)
LIB_LDLIBS := -lucp -lucs -lpthread -ldl -lm

LIB_SRCS := $(wildcard base/*.c gpu/*.c bootstrap/*.c cudaipc/*.c engine/*.c nccl_shim/*.c algorithms/*.c transports/*.c kernels/*.c shm/*.c)
LIB_OBJS := $(LIB_SRCS:%.c=$(BUILD)/obj/%.o) $(BUILD)/obj/kernels/fatbin.o
LIB_HDRS := $(wildcard $(addsuffix *.h,$(sort $(dir $(LIB_SRCS)))))
# Stamp of tools/check_layers.sh: no include of the library runs up a layer.
LAYERS_OK := $(BUILD)/layers.ok
LIB := $(BUILD)/lib/libnccl.so.2
INTERNAL := $(BUILD)/lib/libncclshim_internal.a

UNIT_SRCS := $(wildcard test/unit/test_*.c)
UNIT_BINS := $(UNIT_SRCS:test/unit/%.c=$(BUILD)/test/unit/%)
MP_SRCS := $(filter-out test/mp/dropin.c,$(wildcard test/mp/*.c))
MP_BINS := $(MP_SRCS:test/mp/%.c=$(BUILD)/test/mp/%)
BENCH_SRCS := $(filter-out tools/bench/kernel_perf.c,$(wildcard tools/bench/*.c))
BENCH := $(BUILD)/bin/nccl_perf
BENCH_COLLS := all_reduce all_gather reduce_scatter broadcast reduce alltoall gather scatter \
               sendrecv
LAUNCHER := $(BUILD)/bin/ncclshim-launch

# A consumer of the library links it like NCCL, and finds it next door at run time.
CONSUMER_LDFLAGS := $(LDFLAGS) -L$(BUILD)/lib -Wl,-rpath,'$$ORIGIN/../lib' -Wl,-rpath,'$$ORIGIN/../../lib'

.PHONY: all lib tools check-deps deps test test-unit test-layers test-kernels test-mp test-abi \
        test-headers \
        test-dropin test-asan run install clean
all: lib tools

# --- dependencies ---------------------------------------------------------------------------
check-deps:
	@tools/fetch_nccl.sh $(NCCL_ABI) $(NCCL_HOME)
	@test -f /usr/include/ucp/api/ucp.h || { echo "UCX headers missing: apt-get install libucx-dev"; exit 1; }

deps:
	@tools/deps.sh $(DEPS_FOR)
	@tools/fetch_nccl.sh $(NCCL_ABI) $(NCCL_HOME)

# --- the library ----------------------------------------------------------------------------
lib: check-deps $(LIB)

# Which layer may include which is the ```layers block of ARCHITECTURE.md; the check runs
# before anything compiles, and again whenever a source, a header or the block changes.
$(LAYERS_OK): tools/check_layers.sh ARCHITECTURE.md $(LIB_SRCS) $(LIB_HDRS)
	@tools/check_layers.sh ARCHITECTURE.md $(LIB_SRCS) $(LIB_HDRS)
	@mkdir -p $(dir $@) && touch $@

$(BUILD)/obj/%.o: %.c | check-deps $(LAYERS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(LIB_CFLAGS) -MMD -MP -c $< -o $@

# Element loops are the hot path: let the compiler vectorize them.
$(BUILD)/obj/kernels/%.o: kernels/%.c | check-deps $(LAYERS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(LIB_CFLAGS) -O3 -MMD -MP -c $< -o $@

# --- the CUDA kernels ------------------------------------------------------------------------
# kernels/reduce_device.cu, compiled by nvcc (when the toolkit has it) for every architecture
# that nvcc lists, plus PTX of the newest for the ones after it, into one compressed fatbin that
# kernels/fatbin.S embeds in the library's .nv_fatbin section. A kernel that fails to compile
# fails the build. Without nvcc the fatbin is empty: the library is built host only, and a
# device buffer gets an error saying so.
NVCC := $(wildcard $(CUDA_HOME)/bin/nvcc)
KERNEL_ARCHS := $(if $(NVCC),$(patsubst compute_%,%,$(shell $(NVCC) --list-gpu-arch 2>/dev/null)))
KERNEL_PTX_ARCH := $(lastword $(shell printf '%s\n' $(KERNEL_ARCHS) | sort -n))
comma := ,
NVCC_GENCODE := $(foreach a,$(KERNEL_ARCHS),-gencode=arch=compute_$(a),code=sm_$(a)) \
                $(if $(KERNEL_PTX_ARCH),-gencode=arch=compute_$(KERNEL_PTX_ARCH)$(comma)code=compute_$(KERNEL_PTX_ARCH))
# Device code, the same for every build of the host code (a sanitizer's, the GPU carry's): made
# once, under KERNELS_BUILD, and shared; nvcc takes most of a clean build's time.
KERNELS_BUILD ?= build
FATBIN := $(KERNELS_BUILD)/kernels/reduce_device.fatbin

$(FATBIN): kernels/reduce_device.cu kernels/reduce_ops.h kernels/device_abi.h
	@mkdir -p $(dir $@)
ifneq ($(NVCC),)
	$(NVCC) -fatbin -O3 --fmad=false --threads 0 -Xfatbin -compress-all -I. $(NVCC_GENCODE) \
	    -o $@ $<
else
	@echo "nvcc not found under $(CUDA_HOME): building host only, without the CUDA kernels"
	@: > $@
endif

$(BUILD)/obj/kernels/fatbin.o: kernels/fatbin.S $(FATBIN)
	@mkdir -p $(dir $@)
	$(CC) -c -Wa,-I,$(dir $(FATBIN)) -o $@ $<

$(LIB): $(LIB_OBJS) nccl_shim/exports.map $(LAYERS_OK)
	@mkdir -p $(dir $@)
	$(CC) -shared -Wl,-soname,libnccl.so.2 -Wl,--version-script=nccl_shim/exports.map \
	    -Wl,--no-undefined $(LDFLAGS) -o $@ $(LIB_OBJS) $(LIB_LDLIBS)
	ln -sf libnccl.so.2 $(BUILD)/lib/libnccl.so

$(INTERNAL): $(LIB_OBJS) $(LAYERS_OK)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $(LIB_OBJS)

# --- tools ----------------------------------------------------------------------------------
tools: $(LAUNCHER) $(BENCH) $(BENCH_COLLS:%=$(BUILD)/bin/%_perf) $(BUILD)/bin/kernel_perf \
       $(BUILD)/bin/ipc_probe $(BUILD)/bin/from_check

$(LAUNCHER): tools/launcher/launcher.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $<

$(BENCH): $(BENCH_SRCS) $(wildcard tools/bench/*.h) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $(BENCH_SRCS) $(CONSUMER_LDFLAGS) -lnccl -lm

# The host kernels alone, linked with their objects (kr_copy_host_stream is not exported).
KERNEL_OBJS := $(BUILD)/obj/kernels/reduce_host.o $(BUILD)/obj/kernels/types.o
$(BUILD)/bin/kernel_perf: tools/bench/kernel_perf.c $(KERNEL_OBJS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $< $(KERNEL_OBJS)

# What a GPU machine must measure for the device team's mapping policy (tools/gpu-check probe):
# the driver through gpu/driver.c's table, nothing else of the library.
$(BUILD)/bin/ipc_probe: tools/gpu/ipc_probe.c $(INTERNAL)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< $(INTERNAL) -ldl -lpthread -lm

# The kernels a device team's leader alone on its GPU enqueues before their batch is known
# (tools/gpu-check quick, make test-kernels).
$(BUILD)/bin/from_check: tools/gpu/from_check.c $(INTERNAL)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< $(INTERNAL) -ldl -lpthread -lm

# nccl-tests names: all_reduce_perf runs the all-reduce benchmark, as the binary name says.
$(BUILD)/bin/%_perf: $(BENCH)
	ln -sf nccl_perf $@

# --- the CUDA driver's test double -----------------------------------------------------------
# test/doubles/fake_cuda/: a libcuda.so.1 that runs the device path on the CPU, so that CI
# tests it for real. Tests find it through LD_LIBRARY_PATH=$(FAKE_CUDA_DIR); the library under
# test dlopens it as it would the real driver.
FAKE_CUDA_DIR := $(BUILD)/test/doubles
FAKE_CUDA := $(FAKE_CUDA_DIR)/libcuda.so.1
FAKE_CUDA_SRCS := $(wildcard test/doubles/fake_cuda/*.c)
# The emulated kernels are kernels/reduce_device.cu itself, which kernels_cpu.cpp includes and
# the host C++ compiler builds (no nvcc). -Wno-unknown-pragmas: its `#pragma unroll`s, which
# g++ ignores. -fno-strict-aliasing: kernels read and write the same bytes as uint4 and as
# elements (in place), which g++ must not reorder as it may across types. -ffp-contract=off: as
# nvcc's --fmad=false, no product fused into a sum where FMA is there. $(TLS_DIALECT): every
# emulated thread reads the thread-local blockIdx and threadIdx. No exceptions nor RTTI: the
# object needs nothing of libstdc++ and links into the C double like one more .o.
FAKE_CUDA_KERNELS := $(BUILD)/obj/test/doubles/fake_cuda/kernels_cpu.o
FAKE_CXXFLAGS := -std=gnu++17 -O2 -g -fPIC -Wall -Wextra -Werror -Wno-unknown-pragmas \
                 -fno-strict-aliasing -ffp-contract=off -fno-exceptions -fno-rtti \
                 -fvisibility=hidden $(TLS_DIALECT) $(SAN_FLAGS)

$(FAKE_CUDA_KERNELS): test/doubles/fake_cuda/kernels_cpu.cpp kernels/reduce_device.cu \
                      $(wildcard test/doubles/fake_cuda/*.h) kernels/reduce_ops.h \
                      kernels/device_abi.h | check-deps
	@mkdir -p $(dir $@)
	$(CXX) -I. -I$(CUDA_HOME)/include $(FAKE_CXXFLAGS) -c $< -o $@

$(FAKE_CUDA): $(FAKE_CUDA_SRCS) $(FAKE_CUDA_KERNELS) $(wildcard test/doubles/fake_cuda/*.h) \
              | check-deps
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(TLS_DIALECT) -fvisibility=hidden -shared -Wl,-soname,libcuda.so.1 \
	    -Wl,--no-undefined -o $@ $(FAKE_CUDA_SRCS) $(FAKE_CUDA_KERNELS) -lpthread

# --- tests ----------------------------------------------------------------------------------
$(BUILD)/test/unit/%: test/unit/%.c $(wildcard test/sim/*.c test/sim/*.h) $(INTERNAL)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -Itest -o $@ $< $(wildcard test/sim/*.c) $(INTERNAL) $(LDFLAGS) -lcriterion $(LIB_LDLIBS)

$(BUILD)/test/mp/%: test/mp/%.c $(wildcard test/mp/*.h) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -Itest -o $@ $< $(CONSUMER_LDFLAGS) -lnccl -lm

# The drop-in program is built against the genuine library, exactly as a user's would be.
$(BUILD)/test/dropin/dropin: test/mp/dropin.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< -L$(NCCL_LIBDIR) -lnccl

# Everything the tests run is built first, a compiler per core; then the tests run one at a
# time (they time out and spin on their own: running two at once gains nothing).
BUILD_JOBS ?= $(shell nproc 2>/dev/null || echo 2)
TEST_BUILT = lib tools $(UNIT_BINS) $(MP_BINS) $(FAKE_CUDA) $(BUILD)/bin/from_check \
              $(BUILD)/test/dropin/dropin $(BUILD)/test/netns/hostloss $(FUZZ_BINS) \
              $(BUILD)/fuzz/gen_seeds $(BUILD)/fuzz/root_abuse

test: DEPS_FOR = test
test: deps
	@$(MAKE) --no-print-directory -j$(BUILD_JOBS) $(TEST_BUILT)
	@$(MAKE) --no-print-directory -j$(BUILD_JOBS) BUILD=build/asan SANITIZE=address \
	    $(ASAN_BUILT)
	@$(MAKE) --no-print-directory test-layers test-kernels test-unit test-abi test-headers \
	    test-mp test-dropin \
	    test-asan test-fuzz test-netns

# Every unit test sees the driver's double: the device layers' tests need it, and the others
# must not care whether a driver is present.
test-unit: $(UNIT_BINS) $(FAKE_CUDA)
	@LD_LIBRARY_PATH=$(FAKE_CUDA_DIR) test/run_unit.sh $(UNIT_BINS)

# The layer check itself: planted upward includes must fail it, the real tree must pass.
test-layers:
	@test/layers.sh $(LIB_SRCS) $(LIB_HDRS)

# The kernels compiled for every architecture and embedded where the driver looks; then
# kr_dev_from and kr_dev_signal as a device team runs them, through the driver's double (a GPU
# machine runs the same program on its GPU: tools/gpu-check quick).
test-kernels: $(LIB) $(BUILD)/bin/from_check $(FAKE_CUDA)
	@test/kernels_check.sh $(LIB) $(NVCC)
	@LD_LIBRARY_PATH=$(FAKE_CUDA_DIR) $(BUILD)/bin/from_check

test-abi: $(LIB)
	@test/abi_check.sh $(NCCL_LIBDIR)/libnccl.so.2 $(LIB)
	@$(if $(NCCL_OLD_LIBDIR),test/abi_check.sh $(NCCL_OLD_LIBDIR)/libnccl.so.2 $(LIB))
	@test/abi_needed.sh $(LIB) test/abi/torch-*-nccl-symbols.txt

# The multi-process tests are programs any NCCL user could write: they compile against the
# older NCCL's nccl.h too (what it lacks, they leave out).
test-headers:
	@$(if $(NCCL_OLD_INC),for f in $(MP_SRCS) test/mp/dropin.c; do \
	    $(CC) -I. -I$(NCCL_OLD_INC) -I$(CUDA_HOME)/include -D_GNU_SOURCE $(CFLAGS) -Itest \
	        -fsyntax-only $$f || exit 1; done; \
	    echo "headers: $(words $(MP_SRCS) dropin) programs compile against $(NCCL_OLD_INC)/nccl.h")

test-mp: $(MP_BINS) $(LAUNCHER) tools $(FAKE_CUDA)
	@BUILD=$(BUILD) test/mp/run.sh

test-dropin: $(BUILD)/test/dropin/dropin $(LIB) $(LAUNCHER)
	@BUILD=$(BUILD) NCCL_LIBDIR=$(NCCL_LIBDIR) test/mp/dropin.sh

# The multi-process tests again, library and programs built with AddressSanitizer.
ASAN_BUILT = lib tools $(MP_SRCS:test/mp/%.c=build/asan/test/mp/%) build/asan/test/doubles/libcuda.so.1
test-asan:
	@$(MAKE) --no-print-directory BUILD=build/asan SANITIZE=address $(ASAN_BUILT)
	@BUILD=build/asan MP_QUICK=1 test/mp/run.sh

# --- main job -------------------------------------------------------------------------------
# Every collective's benchmark on NRANKS local ranks, each result checked; fails if any
# size of any collective has a wrong element (the benchmark then exits non-zero).
run: DEPS_FOR = build
run: deps
	@$(MAKE) --no-print-directory all
	@failed=; for coll in $(BENCH_COLLS); do \
	    cmd="$(LAUNCHER) -n $(NRANKS) -t 900 $(BUILD)/bin/$${coll}_perf -b 8 -e 64M -f 2 -c 1"; \
	    echo "$$cmd -w 2 -n 10"; $$cmd -w 2 -n 10 || failed="$$failed $$coll"; \
	done; \
	if [ -n "$$failed" ]; then echo "make run: FAILED:$$failed"; exit 1; fi; \
	echo "make run: every collective passed its checks on $(NRANKS) ranks"

# --- the GPU machine ------------------------------------------------------------------------
# What tools/gpu-check needs there, built here (the GPU machine has no UCX headers) into a
# folder of its own that travels to it: the library, the tools, the multi-process tests, and
# the driver's double, with which the same stages dry-run here (DRY_RUN=1). tools/gpu-check
# prepare runs `make BUILD=build-gpu KERNEL_ARCHS=90 KERNELS_BUILD=build-gpu gpu-carry`: the
# H200's kernels alone, in a fatbin of that folder's own, so the main build's fatbin of every
# architecture is neither used nor replaced; then builds nccl-tests and packs it all in one file.
.PHONY: gpu-carry
gpu-carry: lib tools $(MP_BINS) $(BUILD)/test/netns/hostloss $(FAKE_CUDA)

# --- comparison -----------------------------------------------------------------------------
# ncclshim's busbw beside Open MPI, MPICH and Gloo (when python3-torch is there), 2 and 4
# ranks, alternating runs; table, results.csv and PNGs in $(BUILD)/compare. QUICK=1: fewer sizes.
.PHONY: compare
MPI_PERFS := $(BUILD)/compare/mpi_perf.openmpi $(BUILD)/compare/mpi_perf.mpich
compare: DEPS_FOR = compare
compare: deps
	@$(MAKE) --no-print-directory all $(MPI_PERFS)
	@/usr/bin/python3 tools/compare/compare.py --build $(BUILD) $(if $(QUICK),--quick)

# The same across hosts made of network namespaces (tools/compare/hosts.py): 2 hosts x 1 rank,
# 2 x 2 and 4 x 1, each MPI as a multi-node job; plus the bytes each library puts between the
# hosts per call, and iperf3's TCP ceiling. Output in $(BUILD)/compare-hosts. Needs root and
# `ip netns`; skips (exit 0) without them. QUICK=1 (a few sizes, one pass): 7 minutes on 2
# cores; COLUMNS=1 (the summary's sizes only, two passes); the full run: 2 to 3 hours there
# (an estimate).
.PHONY: compare-hosts
compare-hosts:
	@status=0; /usr/bin/python3 tools/compare/hosts.py --probe || status=$$?; \
	if [ $$status = 77 ]; then exit 0; elif [ $$status != 0 ]; then exit $$status; fi; \
	$(MAKE) --no-print-directory deps DEPS_FOR=compare && \
	$(MAKE) --no-print-directory all $(MPI_PERFS) && \
	/usr/bin/python3 tools/compare/hosts.py --build $(BUILD) $(if $(QUICK),--quick) \
	    $(if $(COLUMNS),--columns)

# The same MPI benchmark against each MPI, through that MPI's own compiler wrapper.
$(BUILD)/compare/mpi_perf.%: tools/compare/mpi_perf.c
	@mkdir -p $(dir $@)
	/usr/bin/mpicc.$* -std=gnu11 -O2 -Wall -Wextra -Werror -o $@ $<

# --- fuzzing --------------------------------------------------------------------------------
# libFuzzer harnesses of the bootstrap (test/fuzz/fuzz_*.c), built with clang against only the
# sources each names below (no UCX, not the library), each run FUZZ_SECONDS from the seeds
# test/fuzz/gen_seeds.c writes plus the corpus it grew last time; a crash or a broken
# invariant fails `make fuzz` and leaves the input in $(BUILD)/fuzz/<harness>-crash-*.
# test-root-abuse puts strangers at a live root through the real library; test-fuzz runs both,
# short, as `make test` may.
.PHONY: fuzz test-fuzz test-root-abuse
FUZZ_SECONDS ?= 30
FUZZ_CC ?= clang
FUZZ_CFLAGS := -std=gnu11 -O1 -g -fno-omit-frame-pointer -Wall -Wextra -Werror \
               -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
FUZZ_NAMES := $(patsubst test/fuzz/%.c,%,$(wildcard test/fuzz/fuzz_*.c))
FUZZ_BINS := $(FUZZ_NAMES:%=$(BUILD)/fuzz/%)
FUZZ_SRCS_fuzz_bootstrap_wire := bootstrap/wire.c
FUZZ_SRCS_fuzz_bootstrap_root := bootstrap/wire.c bootstrap/socket.c \
                                 base/debug.c base/env.c

$(BUILD)/fuzz/fuzz_%: test/fuzz/fuzz_%.c $(wildcard test/fuzz/*.h base/*.[ch] bootstrap/*.[ch]) \
                      | check-deps
	@mkdir -p $(dir $@)
	@command -v $(FUZZ_CC) >/dev/null || \
	    { echo "$(FUZZ_CC) missing: apt-get install clang libclang-rt-dev"; exit 1; }
	$(FUZZ_CC) $(CPPFLAGS) $(FUZZ_CFLAGS) -o $@ $< $(FUZZ_SRCS_$(notdir $@)) -lpthread

$(BUILD)/fuzz/gen_seeds: test/fuzz/gen_seeds.c bootstrap/wire.c bootstrap/wire.h | check-deps
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< bootstrap/wire.c

fuzz: $(FUZZ_BINS) $(BUILD)/fuzz/gen_seeds
	@$(BUILD)/fuzz/gen_seeds $(BUILD)/fuzz/seeds >/dev/null
	@failed=; for h in $(FUZZ_NAMES); do \
	    mkdir -p $(BUILD)/fuzz/corpus/$$h; \
	    $(BUILD)/fuzz/$$h -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=2048 \
	        -print_final_stats=1 -artifact_prefix=$(BUILD)/fuzz/$$h- \
	        $(BUILD)/fuzz/corpus/$$h $(BUILD)/fuzz/seeds/$$h >$(BUILD)/fuzz/$$h.log 2>&1 \
	        || failed="$$failed $$h"; \
	    runs=$$(sed -n 's/^stat::number_of_executed_units: *//p' $(BUILD)/fuzz/$$h.log); \
	    rate=$$(sed -n 's/^stat::average_exec_per_sec: *//p' $(BUILD)/fuzz/$$h.log); \
	    cov=$$(grep -o 'cov: [0-9]* ft: [0-9]*' $(BUILD)/fuzz/$$h.log | tail -1); \
	    echo "fuzz: $$h: $${runs:-?} runs in $(FUZZ_SECONDS) s ($${rate:-?}/s)," \
	        "$${cov:-no coverage line}"; \
	done; \
	if [ -n "$$failed" ]; then \
	    for h in $$failed; do echo "fuzz: $$h FAILED; end of $(BUILD)/fuzz/$$h.log:"; \
	        grep -v '^#' $(BUILD)/fuzz/$$h.log | tail -40; done; \
	    exit 1; \
	fi

$(BUILD)/fuzz/root_abuse: test/fuzz/root_abuse.c bootstrap/wire.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< bootstrap/wire.c $(CONSUMER_LDFLAGS) -lnccl

# Twice: the strangers alone, then with a flood of idle connections past the root's
# descriptor limit (rank 0 runs under a soft limit of 256). 60 s bounds each run.
test-root-abuse: $(BUILD)/fuzz/root_abuse
	@UCX_NET_DEVICES=$${UCX_NET_DEVICES:-lo} timeout 60 $(BUILD)/fuzz/root_abuse
	@(ulimit -Sn 256 && UCX_NET_DEVICES=$${UCX_NET_DEVICES:-lo} NCCLSHIM_BOOTSTRAP_TIMEOUT=30 \
	    timeout 60 $(BUILD)/fuzz/root_abuse -f 400)

test-fuzz:
	@$(MAKE) --no-print-directory fuzz FUZZ_SECONDS=5
	@$(MAKE) --no-print-directory test-root-abuse

# --- several hosts (network namespaces) ------------------------------------------------------
# test/netns/run.sh: three hosts made of network namespaces and veth pairs on one bridge, ranks
# in each over UCX's TCP, every collective checked, and a host that goes away (killed, or its
# veth deleted) must give the others errors, not a hang. Needs root and `ip netns`; skips
# (exit 0, "netns: skipped: ...") without them. About 30 s.
.PHONY: test-netns
$(BUILD)/test/netns/hostloss: test/netns/hostloss.c $(wildcard test/mp/*.h) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -Itest -o $@ $< $(CONSUMER_LDFLAGS) -lnccl -lm

test-netns: $(BUILD)/test/mp/collectives $(BUILD)/test/mp/streams $(BUILD)/test/netns/hostloss \
            $(BUILD)/bin/broadcast_perf $(FAKE_CUDA)
	@BUILD=$(BUILD) test/netns/run.sh

install: $(LIB)
	install -d $(DESTDIR)$(PREFIX)/lib
	install -m 0755 $(LIB) $(DESTDIR)$(PREFIX)/lib/libnccl.so.2
	ln -sf libnccl.so.2 $(DESTDIR)$(PREFIX)/lib/libnccl.so

clean:
	rm -rf build

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
