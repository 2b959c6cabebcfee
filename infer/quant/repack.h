/*
 * repack.h: weights rearranged once at load into an interleaved layout that the tiled integer
 * kernels stream (internal to infer/; the file on disk and its mapping are never written).
 *
 * Layout "R16" (Q8_0, Q4_0, MXFP4): rows in groups of QR_ROWS = 16; a group is its 16 rows' blocks
 * interleaved, block index by block index. For each block index i a group holds the 16 rows'
 * f16 scales (32 bytes), then the quants as k-steps of 16 rows x 4 bytes (64 bytes: one 512-bit
 * register, lane r = row r), so one multiply-add with four activation bytes broadcast to every
 * lane advances all 16 rows' dot products at once and no horizontal sums are ever needed:
 *   Q8_0: 8 k-steps; byte j of row r in step s is the weight 4s + j plus 128 (as unsigned: the
 *         unsigned operand of vpdpbusd; the 128 comes off through the activation's block sum).
 *   Q4_0: 4 k-steps; byte j of row r in step s is the block's byte qs[4s + j] unchanged: its low
 *         nibble is element 4s + j, its high nibble element 16 + 4s + j (the -8 comes off the
 *         same way).
 *   Q4_K: per 256-element block index, 2304 bytes: the 16 d (f16, 32 bytes), the 16 dmin
 *         (32 bytes), the 12 packed scale bytes of each row as three arrays of 16 words (words
 *         0, 1, 2 of rows 0..15: 64 bytes each, so one register holds one word of every row and
 *         the 6-bit scales and mins unpack with word-wide masks and shifts), then 4 chunks of 8
 *         k-steps (2048 bytes): byte j of row r in step s of chunk c is qs[32c + 4s + j], its
 *         low nibble element 64c + 4s + j (sub-block 2c), its high nibble 32 elements on
 *         (sub-block 2c + 1).
 *   Q6_K: per 256-element block index, 3360 bytes: the 16 d (f16, 32 bytes), the 16 8-bit
 *         scales of each row as [sub-block][row] (256 bytes), the low-bit bytes (2048: for half
 *         h, pair kk and step s, byte j of row r is ql[64h + 32kk + 4s + j], low nibble element
 *         128h + 32kk + 4s + j, high nibble 64 elements on), then the high-bit bytes (1024: for
 *         half h and step s, byte j of row r is qh[32h + 4s + j], bits 2k..2k+1 for element
 *         128h + 32k + 4s + j).
 *   MXFP4: per 32-element block index, 272 bytes: the 16 rows' E8M0 exponent bytes, then the
 *         codes as Q4_0's 4 k-steps (byte j of row r in step s is qs[4s + j]).
 * A group of a row of n elements takes exactly 16 x quant_row_bytes(t, n) bytes (the same size
 * as the rows it holds), so group g starts at g * quant_repack_group_bytes(t, n).
 *
 * Threads: pure functions; the kernel tables are fixed after quant_init().
 */
#ifndef SHOAL_REPACK_H
#define SHOAL_REPACK_H

#include "infer/quant/quant.h"

#include <stddef.h>
#include <stdint.h>

#define QR_ROWS  16    /* rows per interleaved group */
#define QR_NT    8     /* activation vectors per kernel call at most */
#define QR_MAX_N 32768 /* row length (elements) the kernels take at most */

/* 1 when weights of type t can be repacked (Q8_0, Q4_0, Q4_K, Q6_K, MXFP4). */
int quant_repack_supported(int t);
/* Bytes of one group of 16 rows of n elements. */
size_t quant_repack_group_bytes(int t, int n);
/* Rearranges rows [0, 16 * ngroups) of src (rows of n elements, stride bytes apart) into dst
 * (ngroups * quant_repack_group_bytes(t, n) bytes). */
void quant_repack(int t, const uint8_t *src, size_t stride, int ngroups, int n, uint8_t *dst);
/* The inverse, for tests: group data back to rows of quant_row_bytes(t, n) bytes. */
void quant_unpack(int t, const uint8_t *src, int ngroups, int n, uint8_t *dst);

/* out[v * ldo + 16 * g + r] = dot(row r of group g, x[v]) for groups g < ngroups (w points at
 * the first), rows r < 16, vectors v < nt (1 <= nt <= QR_NT); x prepared for weights of type t
 * (Q8_0 activations with block sums; Q8_K for Q4_K and Q6_K). */
typedef void (*quant_gemm_fn)(float *out, int ldo, const uint8_t *w, int ngroups,
			      const quant_act_t *x, int nt, int n);

quant_gemm_fn quant_gemm(int t);     /* best available for the CPU; NULL when t has none */
quant_gemm_fn quant_gemm_ref(int t); /* plain C */
const char *quant_gemm_impl(int t);  /* "avx512vnni", "avx2", "neon", "ref" or NULL */

/* Per-architecture tables (gemm_x86.c, gemm_neon.c): NULL when not built or not supported. */
quant_gemm_fn quant_x86_gemm(int t, const char **impl);
quant_gemm_fn quant_neon_gemm(int t, const char **impl);

#endif
