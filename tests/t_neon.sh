#!/bin/sh
# t_neon.sh: the NEON kernels (infer/quant/quant_neon.c), cross-compiled for aarch64 and run under
# qemu-user. The program is tests/test_quant.c itself, so the NEON tables are checked against the
# same reference kernels (infer/quant/quant.c), on the same data and NMSE bounds, as the AVX2 ones.
# Two builds: -march=armv8.2-a+dotprod (sdot, run on qemu's default "max" CPU) and a baseline
# -march=armv8-a one run on a Cortex-A72 model, which has no sdot: it would die of SIGILL if the
# baseline path used it. Then the dotprod build again under ASan+UBSan and with clang (the Mac
# compiler); then tests/test_model.c, the whole forward pass, on the NEON kernels; last every
# infer/*.c compiled for aarch64 with the warning flags.
# Needs gcc-aarch64-linux-gnu, libc6-dev-arm64-cross, qemu-user (optional packages of
# scripts/install-deps.sh); skips with one line without them. binfmt_misc is not assumed: qemu
# is always called explicitly. Emulated speed means nothing here; this is correctness only.
. tests/lib.sh

XCC=${XCC:-aarch64-linux-gnu-gcc}
XDUMP=${XDUMP:-aarch64-linux-gnu-objdump}
SYSROOT=${SYSROOT:-/usr/aarch64-linux-gnu}
QEMU=${QEMU:-qemu-aarch64}

if ! command -v "$XCC" >/dev/null 2>&1 || ! command -v "$XDUMP" >/dev/null 2>&1; then
	skip "aarch64 cross compiler missing (apt-get install gcc-aarch64-linux-gnu)"
	done_tests
	exit
fi
if [ ! -e "$SYSROOT/lib/libc.so.6" ] || [ ! -e "$SYSROOT/include/stdio.h" ]; then
	skip "aarch64 sysroot missing at $SYSROOT (apt-get install libc6-dev-arm64-cross)"
	done_tests
	exit
fi
if ! command -v "$QEMU" >/dev/null 2>&1; then
	skip "$QEMU missing (apt-get install qemu-user)"
	done_tests
	exit
fi

OUT=$BUILD/aarch64
mkdir -p "$OUT/obj"
CFLAGS="-O2 -g -std=gnu11 -Wall -Wextra -Werror -pthread -I."
# Only what test_quant needs: the block formats and kernels, the thread pool, common/.
SRC="tests/test_quant.c $(ls infer/quant/*.c) infer/pool.c $(ls common/*.c)"

# build NAME MARCH [FLAGS...]: cross-compiles test_quant with $BCC (default $XCC) into
# $OUT/test_quant_NAME (log in $OUT/NAME.log).
build() {
	name=$1 march=$2
	shift 2
	# shellcheck disable=SC2086
	${BCC:-$XCC} $CFLAGS -march="$march" "$@" $SRC -lm -o "$OUT/test_quant_$name" >"$OUT/$name.log" 2>&1
	rc=$?
	[ $rc -ne 0 ] && sed 's/^/    /' "$OUT/$name.log" >&2
	return $rc
}

# run NAME CPU: runs a build under qemu; passes when test_quant closes with "N passed, 0 failed".
run() {
	"$QEMU" -L "$SYSROOT" -cpu "$2" "$OUT/test_quant_$1" >"$OUT/$1.out" 2>"$OUT/$1.err"
	rc=$?
	sed "s/^/    $1 on $2: /" "$OUT/$1.out" "$OUT/$1.err" >&2
	[ $rc -eq 0 ] && grep -qE '^[0-9]+ passed, 0 failed' "$OUT/$1.out"
}

# count_insn BINARY MNEMONIC [FUNCTION-PREFIX]: how many such instructions (in those functions).
count_insn() {
	"$XDUMP" -d "$1" | awk -v op="$2" -v fp="${3:-}" '
		/^[0-9a-f]+ <.*>:$/ { fn = substr($2, 2, length($2) - 3); next }
		$3 == op && (fp == "" || index(fn, fp) == 1) { n++ }
		END { print n + 0 }'
}

# 1. dotprod build: the NEON kernels use sdot and pass the shared test.
if build dotprod armv8.2-a+dotprod; then
	pass
	n=$(count_insn "$OUT/test_quant_dotprod" sdot neon_rows_)
	check "dotprod build: sdot in the NEON kernels (found $n)" [ "$n" -gt 0 ]
	check "dotprod build passes test_quant under qemu (cpu max)" run dotprod max
	# The control for step 2: this CPU model really lacks sdot, so the dotprod build must die.
	"$QEMU" -L "$SYSROOT" -cpu cortex-a72 "$OUT/test_quant_dotprod" >/dev/null 2>&1
	rc=$?
	check "dotprod build dies of SIGILL on cortex-a72 (exit $rc, want 132)" [ $rc -eq 132 ]
else
	fail "cross-compile test_quant with -march=armv8.2-a+dotprod"
fi

# 2. baseline build: vmull_s8/vpadalq_s16 path, no sdot anywhere, runs on a CPU without it.
if build base armv8-a; then
	pass
	n=$(count_insn "$OUT/test_quant_base" sdot)
	check "baseline build contains no sdot (found $n)" [ "$n" -eq 0 ]
	n=$(count_insn "$OUT/test_quant_base" sadalp neon_rows_)
	check "baseline build: sadalp in the NEON kernels (found $n)" [ "$n" -gt 0 ]
	check "baseline build passes test_quant under qemu (cpu cortex-a72)" run base cortex-a72
else
	fail "cross-compile test_quant with -march=armv8-a"
fi

# 3. The dotprod build under ASan+UBSan (LeakSanitizer cannot run under qemu-user: leaks off).
if build san armv8.2-a+dotprod -fsanitize=address,undefined -fno-sanitize-recover=undefined \
	-fno-omit-frame-pointer; then
	pass
	ASAN_OPTIONS=detect_leaks=0
	export ASAN_OPTIONS
	check "ASan+UBSan build passes test_quant under qemu (cpu max)" run san max
else
	fail "cross-compile test_quant with -fsanitize=address,undefined"
fi

# 4. clang, the compiler macOS builds with (its own arm_neon.h): the dotprod build again.
if command -v clang >/dev/null 2>&1; then
	if BCC="clang --target=aarch64-linux-gnu" build clang armv8.2-a+dotprod; then
		pass
		check "clang build passes test_quant under qemu (cpu max)" run clang max
	else
		fail "cross-compile test_quant with clang --target=aarch64-linux-gnu"
	fi
else
	skip "clang missing: the clang build of the NEON kernels is not checked"
fi

# 5. The forward pass on the NEON kernels: tests/test_model.c (stories260K's greedy ids must equal
# llama.cpp's; batched prefill, which goes through sgemm, must match one-token decoding in every
# weight type) with model.c's -DSHOAL_ACCELERATE branch, as on a Mac. There is no arm64 BLAS
# here: tests/cross/ has a stand-in Accelerate/Accelerate.h and a plain C cblas_sgemm.
MODEL_SRC="tests/test_model.c $(ls infer/model/*.c) infer/gguf.c infer/gguf_write.c
$(ls infer/quant/*.c) infer/pool.c $(ls common/*.c) tests/cross/sgemm_ref.c"
# shellcheck disable=SC2086
if "$XCC" $CFLAGS -march=armv8.2-a+dotprod -DSHOAL_ACCELERATE -Itests/cross $MODEL_SRC -lm \
	-o "$OUT/test_model_accel" >"$OUT/model.log" 2>&1; then
	pass
	"$QEMU" -L "$SYSROOT" "$OUT/test_model_accel" >"$OUT/model.out" 2>"$OUT/model.err"
	rc=$?
	sed 's/^/    test_model: /' "$OUT/model.out" >&2
	grep -h '^skip ' "$OUT/model.err" | sed 's/^/    test_model: /' >&2
	check "test_model (NEON kernels, SHOAL_ACCELERATE) passes under qemu (exit $rc)" \
		sh -c '[ "$1" -eq 0 ] && grep -qE "^[0-9]+ passed, 0 failed" "$2"' _ "$rc" "$OUT/model.out"
	[ $rc -eq 0 ] || tail -n 20 "$OUT/model.err" | sed 's/^/    /' >&2
else
	sed 's/^/    /' "$OUT/model.log" >&2
	fail "cross-compile test_model with -DSHOAL_ACCELERATE"
fi

# 6. The whole infer/ module compiles for aarch64 without warnings (gcc -O2 -c, so the
# optimizer's warnings count; clang -fsyntax-only). pcre2.h is arch-independent and found in
# /usr/include (Debian's cross compilers search it); no arm64 cblas.h is installed, so model.c
# is compiled against the host's OpenBLAS header (the same CBLAS prototypes on arm64); without
# one, model.c's Linux branch is left out with a note. Its macOS branch was compiled in step 5.
BLAS_INC=$(pkg-config --cflags openblas 2>/dev/null)
# xcompile CC OUTPUT FILE FLAGS...: compiles one file; prints its log and returns 1 on failure.
xcompile() {
	cc=$1 o=$2 f=$3
	shift 3
	# shellcheck disable=SC2086
	if ! $cc $CFLAGS $BLAS_INC "$@" "$f" -o "$o" >"$o.log" 2>&1; then
		sed 's/^/    /' "$o.log" >&2
		return 1
	fi
}
bad=
for f in infer/*.c infer/*/*.c; do
	if grep -q "cblas" "$f" && [ -z "$BLAS_INC" ]; then
		skip "$f not cross-compiled: no cblas.h (libopenblas-dev) to compile against"
		continue
	fi
	b=$OUT/obj/$(basename "$f" .c)
	xcompile "$XCC" "$b.o" "$f" -march=armv8.2-a+dotprod -c || bad="$bad $f"
	if command -v clang >/dev/null 2>&1; then
		xcompile "clang --target=aarch64-linux-gnu" "$b.clang" "$f" -march=armv8.2-a+dotprod \
			-fsyntax-only || bad="$bad $f(clang)"
	fi
done
check "infer/**.c compile for aarch64 with -Wall -Wextra -Werror (failed:${bad:- none})" [ -z "$bad" ]

done_tests
