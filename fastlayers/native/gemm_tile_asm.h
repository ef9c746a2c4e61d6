/* The register tile of gemm.c (gemm_tile) in assembly for AVX-512 on x86-64:
 * c[0:n, 0:32] (+)= sum over i < kh, p < kc of a[r ars + i ari + p] pb[(i kc + p) 32 + 0:32]
 * for n = 1..14 rows, then + bias and ReLU where asked, the same operations in the same order
 * as gemm_tile (the same bits). Tile row r's sums are zmm(2r) and zmm(2r + 1), b's two vectors
 * of a step zmm30 and zmm31, the broadcast value zmm29; row r is read at base r / 3 (rax, rbx,
 * rdx, rdi, r8: three rows apart) plus r % 3 row strides (r10 scaled by 1 or 2), the bases
 * advancing along k, four steps of k per iteration. The compiler's own form of the loop kept
 * a pointer per row and reloaded five of them from the stack at every step (docs/design.md,
 * "GEMM", the tile in assembly). Included by gemm.c alone, after gemm_internal.h; defines
 * GEMM_ASM_TILE where it applies. */
#ifndef FL_GEMM_TILE_ASM_H
#define FL_GEMM_TILE_ASM_H
#include <stddef.h>
#include <stdint.h>

#if FL_VW == 16 && defined(__AVX512F__) && defined(__x86_64__) && GEMM_MR == 14
#define GEMM_ASM_TILE 1

/* A tile's arguments, read by the assembly at the byte offsets checked below. */
typedef struct {
    const float *a;      /* window row 0's first value of tile row 0 */
    int64_t ars, ari;    /* bytes between tile rows, between window rows */
    const float *pb;     /* the packed panel */
    int64_t kc, kh;      /* steps of k per window row (>= 1), window rows (>= 1) */
    float *c;
    int64_t ldc;         /* bytes between rows of c */
    const char *next;    /* lines brought into L2 meanwhile, four per four steps */
    int64_t next_lines;
    const float *bias;   /* two vectors, or NULL for none */
    int64_t flags;       /* GEMM_ASM_ACCUMULATE | GEMM_ASM_RELU */
} gemm_asm_args;
#define GEMM_ASM_ACCUMULATE 1 /* the sums added to c's values */
#define GEMM_ASM_RELU 2       /* max(0, x) after the bias */
_Static_assert(offsetof(gemm_asm_args, a) == 0 && offsetof(gemm_asm_args, ars) == 8 &&
                   offsetof(gemm_asm_args, ari) == 16 && offsetof(gemm_asm_args, pb) == 24 &&
                   offsetof(gemm_asm_args, kc) == 32 && offsetof(gemm_asm_args, kh) == 40 &&
                   offsetof(gemm_asm_args, c) == 48 && offsetof(gemm_asm_args, ldc) == 56 &&
                   offsetof(gemm_asm_args, next) == 64 && offsetof(gemm_asm_args, next_lines) == 72 &&
                   offsetof(gemm_asm_args, bias) == 80 && offsetof(gemm_asm_args, flags) == 88,
               "gemm_asm_args: the assembly reads these byte offsets");

#define GA_ROW(off, addr, c0, c1)                                                              \
    "vbroadcastss " off addr ", %%zmm29\n\t"                                                   \
    "vfmadd231ps %%zmm29, %%zmm30, %%zmm" c0 "\n\t"                                            \
    "vfmadd231ps %%zmm29, %%zmm31, %%zmm" c1 "\n\t"
/* tile rows [0, n) of one step of k, a at byte offset o of each row */
#define GA_R1(o) GA_ROW(o, "(%%rax)", "0", "1")
#define GA_R2(o) GA_R1(o) GA_ROW(o, "(%%rax,%%r10,1)", "2", "3")
#define GA_R3(o) GA_R2(o) GA_ROW(o, "(%%rax,%%r10,2)", "4", "5")
#define GA_R4(o) GA_R3(o) GA_ROW(o, "(%%rbx)", "6", "7")
#define GA_R5(o) GA_R4(o) GA_ROW(o, "(%%rbx,%%r10,1)", "8", "9")
#define GA_R6(o) GA_R5(o) GA_ROW(o, "(%%rbx,%%r10,2)", "10", "11")
#define GA_R7(o) GA_R6(o) GA_ROW(o, "(%%rdx)", "12", "13")
#define GA_R8(o) GA_R7(o) GA_ROW(o, "(%%rdx,%%r10,1)", "14", "15")
#define GA_R9(o) GA_R8(o) GA_ROW(o, "(%%rdx,%%r10,2)", "16", "17")
#define GA_R10(o) GA_R9(o) GA_ROW(o, "(%%rdi)", "18", "19")
#define GA_R11(o) GA_R10(o) GA_ROW(o, "(%%rdi,%%r10,1)", "20", "21")
#define GA_R12(o) GA_R11(o) GA_ROW(o, "(%%rdi,%%r10,2)", "22", "23")
#define GA_R13(o) GA_R12(o) GA_ROW(o, "(%%r8)", "24", "25")
#define GA_R14(o) GA_R13(o) GA_ROW(o, "(%%r8,%%r10,1)", "26", "27")
/* one step of k for n rows: b's two vectors at byte offsets b0 and b1 of rsi, and their
 * lines GEMM_PF_ROWS (16) steps ahead (p0, p1) asked for, as gemm_tile does (docs/design.md,
 * "GEMM", prefetch in the tile) */
#define GA_STEP(n, off, b0, b1, p0, p1)                                                        \
    "vmovups " b0 "(%%rsi), %%zmm30\n\t"                                                       \
    "vmovups " b1 "(%%rsi), %%zmm31\n\t"                                                       \
    "prefetcht0 " p0 "(%%rsi)\n\t"                                                             \
    "prefetcht0 " p1 "(%%rsi)\n\t" GA_R##n(off)
_Static_assert(GEMM_PF_ROWS == 16 && FL_PANEL == 32,
               "GA_STEP's prefetch offsets are 16 rows of 128 bytes ahead");
/* X(c0, c1) over the two accumulators of each of tile rows [0, n) */
#define GA_X1(X) X("0", "1")
#define GA_X2(X) GA_X1(X) X("2", "3")
#define GA_X3(X) GA_X2(X) X("4", "5")
#define GA_X4(X) GA_X3(X) X("6", "7")
#define GA_X5(X) GA_X4(X) X("8", "9")
#define GA_X6(X) GA_X5(X) X("10", "11")
#define GA_X7(X) GA_X6(X) X("12", "13")
#define GA_X8(X) GA_X7(X) X("14", "15")
#define GA_X9(X) GA_X8(X) X("16", "17")
#define GA_X10(X) GA_X9(X) X("18", "19")
#define GA_X11(X) GA_X10(X) X("20", "21")
#define GA_X12(X) GA_X11(X) X("22", "23")
#define GA_X13(X) GA_X12(X) X("24", "25")
#define GA_X14(X) GA_X13(X) X("26", "27")
#define GA_ZERO(c0, c1)                                                                        \
    "vpxord %%zmm" c0 ", %%zmm" c0 ", %%zmm" c0 "\n\t"                                         \
    "vpxord %%zmm" c1 ", %%zmm" c1 ", %%zmm" c1 "\n\t"
#define GA_ADD_C(c0, c1)                                                                       \
    "vaddps (%%rax), %%zmm" c0 ", %%zmm" c0 "\n\t"                                             \
    "vaddps 64(%%rax), %%zmm" c1 ", %%zmm" c1 "\n\t"                                           \
    "add %%r10, %%rax\n\t"
#define GA_BIAS(c0, c1)                                                                        \
    "vaddps %%zmm30, %%zmm" c0 ", %%zmm" c0 "\n\t"                                             \
    "vaddps %%zmm31, %%zmm" c1 ", %%zmm" c1 "\n\t"
/* max(0, x) as fl_vmax(x, 0) gives it: x where x is NaN (MAXPS returns its second source) */
#define GA_RELU(c0, c1)                                                                        \
    "vmaxps %%zmm" c0 ", %%zmm29, %%zmm" c0 "\n\t"                                             \
    "vmaxps %%zmm" c1 ", %%zmm29, %%zmm" c1 "\n\t"
#define GA_STORE(c0, c1)                                                                       \
    "vmovups %%zmm" c0 ", (%%rax)\n\t"                                                         \
    "vmovups %%zmm" c1 ", 64(%%rax)\n\t"                                                       \
    "add %%r10, %%rax\n\t"

/* gemm_tile_asm_n: the tile of n rows on the arguments at g (gemm_asm_args' byte offsets:
 * a 0, ars 8, ari 16, pb 24, kc 32, kh 40, c 48, ldc 56, next 64, next_lines 72, bias 80,
 * flags 88). */
#define GA_TILE(n)                                                                             \
    static void gemm_tile_asm_##n(const gemm_asm_args *g) {                                    \
        __asm__ volatile(                                                                      \
            GA_X##n(GA_ZERO)                                                                   \
            "mov 0(%[g]), %%r12\n\t"                                                           \
            "mov 8(%[g]), %%r10\n\t"                                                           \
            "lea (%%r10,%%r10,2), %%r11\n\t"                                                   \
            "mov 24(%[g]), %%rsi\n\t"                                                          \
            "mov 40(%[g]), %%r13\n\t"                                                          \
            "mov 64(%[g]), %%r14\n\t"                                                          \
            "mov 72(%[g]), %%r15\n\t"                                                          \
            "2:\n\t" /* window row: the five bases, three rows apart */                        \
            "mov %%r12, %%rax\n\t"                                                             \
            "lea (%%rax,%%r11), %%rbx\n\t"                                                     \
            "lea (%%rbx,%%r11), %%rdx\n\t"                                                     \
            "lea (%%rdx,%%r11), %%rdi\n\t"                                                     \
            "lea (%%rdi,%%r11), %%r8\n\t"                                                      \
            "mov 32(%[g]), %%rcx\n\t"                                                          \
            "cmp $4, %%rcx\n\t"                                                                \
            "jb 4f\n\t"                                                                        \
            "1:\n\t" /* four steps; four lines of the next block into L2 while any is left */  \
            "test %%r15, %%r15\n\t"                                                            \
            "jle 3f\n\t"                                                                       \
            "prefetcht1 (%%r14)\n\t"                                                           \
            "prefetcht1 64(%%r14)\n\t"                                                         \
            "prefetcht1 128(%%r14)\n\t"                                                        \
            "prefetcht1 192(%%r14)\n\t"                                                        \
            "add $256, %%r14\n\t"                                                              \
            "sub $4, %%r15\n\t"                                                                \
            "3:\n\t"                                                                           \
            GA_STEP(n, "0", "0", "64", "2048", "2112")                                         \
            GA_STEP(n, "4", "128", "192", "2176", "2240")                                      \
            GA_STEP(n, "8", "256", "320", "2304", "2368")                                      \
            GA_STEP(n, "12", "384", "448", "2432", "2496")                                     \
            "add $16, %%rax\n\t"                                                               \
            "add $16, %%rbx\n\t"                                                               \
            "add $16, %%rdx\n\t"                                                               \
            "add $16, %%rdi\n\t"                                                               \
            "add $16, %%r8\n\t"                                                                \
            "add $512, %%rsi\n\t"                                                              \
            "sub $4, %%rcx\n\t"                                                                \
            "cmp $4, %%rcx\n\t"                                                                \
            "jae 1b\n\t"                                                                       \
            "4:\n\t" /* the last kc % 4 steps one at a time */                                 \
            "test %%rcx, %%rcx\n\t"                                                            \
            "jz 5f\n\t"                                                                        \
            "6:\n\t"                                                                           \
            GA_STEP(n, "0", "0", "64", "2048", "2112")                                         \
            "add $4, %%rax\n\t"                                                                \
            "add $4, %%rbx\n\t"                                                                \
            "add $4, %%rdx\n\t"                                                                \
            "add $4, %%rdi\n\t"                                                                \
            "add $4, %%r8\n\t"                                                                 \
            "add $128, %%rsi\n\t"                                                              \
            "dec %%rcx\n\t"                                                                    \
            "jnz 6b\n\t"                                                                       \
            "5:\n\t"                                                                           \
            "add 16(%[g]), %%r12\n\t"                                                          \
            "dec %%r13\n\t"                                                                    \
            "jnz 2b\n\t"                                                                       \
            "mov 48(%[g]), %%rax\n\t" /* the epilogue: + c where accumulating */               \
            "mov 56(%[g]), %%r10\n\t"                                                          \
            "testq $1, 88(%[g])\n\t"                                                           \
            "jz 7f\n\t"                                                                        \
            GA_X##n(GA_ADD_C)                                                                  \
            "mov 48(%[g]), %%rax\n\t"                                                          \
            "7:\n\t" /* + bias */                                                              \
            "mov 80(%[g]), %%rcx\n\t"                                                          \
            "test %%rcx, %%rcx\n\t"                                                            \
            "jz 8f\n\t"                                                                        \
            "vmovups (%%rcx), %%zmm30\n\t"                                                     \
            "vmovups 64(%%rcx), %%zmm31\n\t"                                                   \
            GA_X##n(GA_BIAS)                                                                   \
            "8:\n\t" /* ReLU */                                                                \
            "testq $2, 88(%[g])\n\t"                                                           \
            "jz 9f\n\t"                                                                        \
            "vpxord %%zmm29, %%zmm29, %%zmm29\n\t"                                             \
            GA_X##n(GA_RELU)                                                                   \
            "9:\n\t"                                                                           \
            GA_X##n(GA_STORE)                                                                  \
            :                                                                                  \
            : [g] "r"(g)                                                                       \
            : "rax", "rbx", "rcx", "rdx", "rsi", "rdi", "r8", "r10", "r11", "r12", "r13",      \
              "r14", "r15", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7",     \
              "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16",   \
              "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm24", "xmm25", \
              "xmm26", "xmm27", "xmm28", "xmm29", "xmm30", "xmm31", "memory", "cc");           \
    }
GA_TILE(1) GA_TILE(2) GA_TILE(3) GA_TILE(4) GA_TILE(5) GA_TILE(6) GA_TILE(7)
GA_TILE(8) GA_TILE(9) GA_TILE(10) GA_TILE(11) GA_TILE(12) GA_TILE(13) GA_TILE(14)

/* gemm_tile_asm[n]: the tile of n rows */
static void (*const gemm_tile_asm[GEMM_MR + 1])(const gemm_asm_args *) = {
    0,                 gemm_tile_asm_1,   gemm_tile_asm_2,   gemm_tile_asm_3,  gemm_tile_asm_4,
    gemm_tile_asm_5,   gemm_tile_asm_6,   gemm_tile_asm_7,   gemm_tile_asm_8,  gemm_tile_asm_9,
    gemm_tile_asm_10,  gemm_tile_asm_11,  gemm_tile_asm_12,  gemm_tile_asm_13, gemm_tile_asm_14};

#undef GA_ROW
#undef GA_STEP
#undef GA_TILE
#undef GA_ZERO
#undef GA_ADD_C
#undef GA_BIAS
#undef GA_RELU
#undef GA_STORE
#undef GA_R1
#undef GA_X1
#undef GA_R2
#undef GA_X2
#undef GA_R3
#undef GA_X3
#undef GA_R4
#undef GA_X4
#undef GA_R5
#undef GA_X5
#undef GA_R6
#undef GA_X6
#undef GA_R7
#undef GA_X7
#undef GA_R8
#undef GA_X8
#undef GA_R9
#undef GA_X9
#undef GA_R10
#undef GA_X10
#undef GA_R11
#undef GA_X11
#undef GA_R12
#undef GA_X12
#undef GA_R13
#undef GA_X13
#undef GA_R14
#undef GA_X14
#endif
#endif
