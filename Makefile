# shoal: zero-config, authenticated, tensor-parallel LLM inference across the machines at hand.
# Plain targets, one comment each. Flags come from pkg-config; warnings are errors.

UNAME_S ?= $(shell uname -s)
CC      ?= cc
BUILD   ?= build
SANITIZE ?=

# Missing system packages are installed before anything is built (quiet when all are present).
# SKIP_DEPS=1 skips the check (packagers, or a dry run of the Darwin branch on Linux).
ifeq ($(filter clean format help uninstall,$(MAKECMDGOALS))$(SKIP_DEPS),)
DEPS_DONE := $(shell sh scripts/install-deps.sh >&2 || echo fail)
endif

ifeq ($(UNAME_S),Darwin)
# macOS: Homebrew's libraries, Bonjour (dns_sd, part of libSystem) and Accelerate for BLAS.
PKGS      := libsodium libmicrohttpd jansson libpcre2-8
DISC_BACKEND ?= dnssd
BLAS_LIBS := -framework Accelerate
# ACCELERATE_NEW_LAPACK: without it SDK 13.3+ marks cblas_sgemm deprecated, an error with -Werror.
BLAS_CFLAGS := -DSHOAL_ACCELERATE -DACCELERATE_NEW_LAPACK
RDMA_LIBS := $(if $(wildcard /usr/lib/libibverbs.dylib /usr/local/lib/libibverbs.dylib),-libverbs,)
else
PKGS      := libsodium libmicrohttpd jansson libpcre2-8
DISC_BACKEND ?= avahi
BLAS_CFLAGS := $(shell pkg-config --cflags openblas 2>/dev/null)
BLAS_LIBS := $(or $(shell pkg-config --libs openblas 2>/dev/null),-lopenblas)
RDMA_LIBS := -libverbs
endif

ifeq ($(DISC_BACKEND),avahi)
DISC_PKGS := avahi-client
else ifeq ($(UNAME_S),Darwin)
DISC_PKGS :=
else
DISC_PKGS := avahi-compat-libdns_sd
endif

PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) $(DISC_PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) $(DISC_PKGS) 2>/dev/null)

CFLAGS  ?= -O2 -g
CFLAGS  += -std=gnu11 -Wall -Wextra -Werror -pthread -I. -MMD -MP \
	   -DSHOAL_DISC_$(DISC_BACKEND) $(PKG_CFLAGS) $(BLAS_CFLAGS)
LDLIBS  += $(PKG_LIBS) $(BLAS_LIBS) $(RDMA_LIBS) -lm -pthread

ifneq ($(SANITIZE),)
BUILD   := $(BUILD)-san
CFLAGS  += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDFLAGS += -fsanitize=$(SANITIZE)
endif

# On Linux with avahi, a second binary with the dns_sd backend (avahi's compat library, the API
# macOS has) is linked from the same objects, so `make test` runs the discovery suite with both.
ifeq ($(UNAME_S)$(DISC_BACKEND),Linuxavahi)
DNSSD_CFLAGS := $(shell pkg-config --cflags avahi-compat-libdns_sd 2>/dev/null)
DNSSD_LIBS   := $(shell pkg-config --libs avahi-compat-libdns_sd 2>/dev/null)
ALT_BIN      := $(BUILD)/shoal-dnssd
endif

MODULES  := common discovery planner transport infer web agent
# A discovery backend file is named *_avahi.c or *_dnssd.c; only the chosen one is built.
# infer/ keeps kernels, tokenizers and the model in sub-folders (infer/quant, infer/tok, infer/model).
ALL_SRC  := $(wildcard $(addsuffix /*.c,$(MODULES)) $(addsuffix /*/*.c,$(MODULES)))
OTHER_BACKEND := $(if $(filter avahi,$(DISC_BACKEND)),dnssd,avahi)
LIB_SRC  := $(filter-out agent/cli/main.c %_$(OTHER_BACKEND).c,$(ALL_SRC))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
TEST_SRC := $(wildcard tests/test_*.c)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)

FUZZ_SRC := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BIN := $(FUZZ_SRC:tests/fuzz/%.c=build-fuzz/%)
FUZZ_SECONDS ?= 10
FUZZ_CFLAGS = $(filter-out -Werror,$(CFLAGS)) -fsanitize=fuzzer-no-link,address,undefined

.SECONDARY:
.PHONY: all test test-asan test-dnssd bench demo fuzz clean format help install uninstall

# Builds the binary build/shoal (and the test programs).
all: $(BUILD)/shoal $(TEST_BIN) $(ALT_BIN)

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/shoal: $(BUILD)/obj/agent/cli/main.o $(LIB_OBJ)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/obj/discovery/mdns_dnssd.o: CFLAGS += $(DNSSD_CFLAGS)

$(BUILD)/shoal-dnssd: $(BUILD)/obj/agent/cli/main.o $(filter-out %/mdns_avahi.o,$(LIB_OBJ)) \
		$(BUILD)/obj/discovery/mdns_dnssd.o
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS) $(DNSSD_LIBS)

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

# The cluster core is pure: its test links only the core, the election and common/ (no library),
# so a call from the core into I/O is a link error here (tests/t_pure.sh also reads nm).
PURE_OBJ := $(BUILD)/obj/agent/core.o $(BUILD)/obj/agent/core_view.o \
	    $(BUILD)/obj/discovery/election.o \
	    $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard common/*.c))
$(BUILD)/tests/test_core: $(BUILD)/obj/tests/test_core.o $(PURE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ -lm -pthread

# Installs missing packages, builds, runs every test; closes with "N passed, N failed".
test: all
	@SHOAL_BIN=$(BUILD)/shoal SHOAL_DNSSD_BIN=$(if $(SANITIZE),,$(ALT_BIN)) \
		sh tests/run.sh $(BUILD) $(T)

# The same tests under AddressSanitizer and UndefinedBehaviorSanitizer (build-san/).
test-asan:
	$(MAKE) SANITIZE=address,undefined test

# The discovery tests again with the dns_sd backend (avahi's compatibility library here), in build-dnssd/.
test-dnssd:
	$(MAKE) DISC_BACKEND=dnssd BUILD=build-dnssd test T=discovery

# Speed and memory figures (prints, never fails on a slow machine).
bench: all
	@sh scripts/bench.sh $(BUILD)

# The main job: a 3-node cluster in network namespaces answers a chat completion (root).
demo: all
	@sh scripts/demo.sh $(BUILD)

# libFuzzer targets (tests/fuzz/fuzz_*.c, built with clang), each run for FUZZ_SECONDS.
fuzz: $(FUZZ_BIN)
	@sh tests/fuzz/run.sh $(FUZZ_SECONDS) $(FUZZ_BIN)

build-fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -c $< -o $@

build-fuzz/%: build-fuzz/obj/tests/fuzz/%.o $(LIB_SRC:%.c=build-fuzz/obj/%.o)
	clang -fsanitize=fuzzer,address,undefined $^ -o $@ $(LDLIBS)

# install / uninstall: the binary, shoal(1) and the systemd unit under $(DESTDIR)$(PREFIX).
PREFIX  ?= /usr/local
BINDIR  := $(PREFIX)/bin
MANDIR  := $(PREFIX)/share/man/man1
UNITDIR := $(PREFIX)/lib/systemd/system
INSTALLED := $(BINDIR)/shoal $(MANDIR)/shoal.1 $(if $(filter Linux,$(UNAME_S)),$(UNITDIR)/shoal.service)

# The man page shoal(1), made from the commands' own --help (scripts/gen_man.sh).
$(BUILD)/shoal.1: $(BUILD)/shoal scripts/gen_man.sh
	sh scripts/gen_man.sh $(BUILD)/shoal > $@

# Installs the binary, shoal(1) and (Linux) shoal.service: make install [PREFIX=/usr/local] [DESTDIR=...].
install: $(BUILD)/shoal $(BUILD)/shoal.1
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(MANDIR)
	install -m 755 $(BUILD)/shoal $(DESTDIR)$(BINDIR)/shoal
	install -m 644 $(BUILD)/shoal.1 $(DESTDIR)$(MANDIR)/shoal.1
ifeq ($(UNAME_S),Linux)
	install -d $(DESTDIR)$(UNITDIR)
	sed 's|/usr/local/bin/shoal|$(BINDIR)/shoal|' scripts/shoal.service > $(DESTDIR)$(UNITDIR)/shoal.service
	chmod 644 $(DESTDIR)$(UNITDIR)/shoal.service
endif

# Removes every file install put there (same PREFIX and DESTDIR).
uninstall:
	rm -f $(addprefix $(DESTDIR),$(INSTALLED))

# Removes every build output.
clean:
	rm -rf build build-*

# Formats the C sources with the committed .clang-format.
format:
	clang-format -i $(ALL_SRC) $(wildcard */*.h */*/*.h tests/*.c tests/*.h)

# Lists the targets.
help:
	@grep -B1 -E '^[a-z-]+:' Makefile | grep -E '^#' | sed 's/^# //'

-include $(wildcard build-fuzz/obj/*/*.d build-fuzz/obj/*/*/*.d build-fuzz/obj/tests/fuzz/*.d)
-include $(LIB_OBJ:.o=.d) $(BUILD)/obj/agent/cli/main.d $(if $(ALT_BIN),$(BUILD)/obj/discovery/mdns_dnssd.d) $(TEST_BIN:$(BUILD)/tests/%=$(BUILD)/obj/tests/%.d)
