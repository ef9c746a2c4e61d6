/* Runtime ISA dispatch: one table of kernel pointers per ISA compiled in (isa_*.c), chosen at
 * import from CPUID, or forced by name (FASTLAYERS_ISA, fastlayers.native.set_isa). The
 * wrappers fl_<name>(...) call the chosen ISA's kernel. */
#ifndef FL_DISPATCH_H
#define FL_DISPATCH_H
#include <stdint.h>

#include "kernels.h"

typedef struct fl_kernels {
    const char *isa;
#define FL_MEMBER(ret, name, params, args) ret (*name) params;
    FL_KERNELS(FL_MEMBER)
#undef FL_MEMBER
} fl_kernels;

extern const fl_kernels *fl_k;

/* Names of the ISAs compiled in, best first ("avx512", "avx2", "generic"), NULL-terminated. */
extern const char *const fl_isa_names[];
/* Whether this CPU can run the ISA `name` (and it was compiled in). */
int fl_isa_runs(const char *name);
/* Use the ISA `name`; -1 when it is unknown or this CPU cannot run it. */
int fl_set_isa(const char *name);
/* The best ISA this CPU runs. */
const char *fl_best_isa(void);

/* 1 where the integer products run VNNI's vpdpbusd (qgemm.c): on the avx512 path with
 * AVX-512 VNNI (zmm), on the avx2 path with AVX-VNNI or AVX512-VL VNNI (ymm). Set with the path
 * when the CPU has it; fl_set_vnni(0) turns it off (the tests run both forms), and
 * fl_set_vnni(1) returns -1 when the path or the CPU has none. fl_vnni_vex: the avx2 path's
 * vpdpbusd takes AVX-VNNI's VEX encoding (the CPU has AVX-VNNI), else the EVEX one. */
extern int fl_vnni, fl_vnni_vex;
int fl_vnni_runs(void);
int fl_set_vnni(int on);

/* 1 where the integer products of enough rows run on AMX tiles (tdpbusd, qgemm.c): on the
 * avx512 path of a CPU with AMX-INT8 whose kernel lets the process use it (Linux asks once,
 * arch_prctl). Set with the path; fl_set_amx(0) turns it off (the tests run both forms), and
 * fl_set_amx(1) returns -1 where it cannot run. Products prepared without VNNI never use it. */
extern int fl_amx;
int fl_amx_runs(void);
int fl_set_amx(int on);

/* The bytes of one core's L2 cache, as the system reports it (sysconf), else 512 KiB (the
 * smallest seen on the x86 hosts): blocks of work sized to stay in it (conv_gemm.c). Asked
 * once. */
int64_t fl_l2_bytes(void);

#define FL_WRAPPER(ret, name, params, args) \
    static inline ret fl_##name params { return fl_k->name args; }
FL_KERNELS(FL_WRAPPER)
#undef FL_WRAPPER
#endif
