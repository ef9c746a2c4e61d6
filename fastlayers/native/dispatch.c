/* Runtime ISA dispatch (dispatch.h): the kernel tables of isa_*.c and CPUID. */
#include "dispatch.h"

#include <string.h>
#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif
#if defined(__linux__) && (defined(__x86_64__) || defined(_M_X64))
#include <sys/syscall.h>
#include <unistd.h>
#endif

#if defined(__x86_64__) || defined(_M_X64)
#define FL_X86 1
extern const fl_kernels fl_kernels_avx512, fl_kernels_avx2;
#else
#define FL_X86 0
#endif
extern const fl_kernels fl_kernels_generic;

const char *const fl_isa_names[] = {
#if FL_X86
    "avx512", "avx2",
#endif
    "generic", 0};

static const fl_kernels *table_of(const char *name) {
#if FL_X86
    if (strcmp(name, "avx512") == 0) return &fl_kernels_avx512;
    if (strcmp(name, "avx2") == 0) return &fl_kernels_avx2;
#endif
    if (strcmp(name, "generic") == 0) return &fl_kernels_generic;
    return 0;
}

int fl_isa_runs(const char *name) {
    if (!table_of(name)) return 0;
#if FL_X86
    __builtin_cpu_init();
    if (strcmp(name, "avx512") == 0)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (strcmp(name, "avx2") == 0)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    return 1;
}

const char *fl_best_isa(void) {
    for (int i = 0; fl_isa_names[i]; ++i)
        if (fl_isa_runs(fl_isa_names[i])) return fl_isa_names[i];
    return "generic";
}

const fl_kernels *fl_k = &fl_kernels_generic;
int fl_vnni = 0, fl_vnni_vex = 0;

int fl_vnni_runs(void) {
#if FL_X86
    __builtin_cpu_init();
    int evex = __builtin_cpu_supports("avx512vnni");
    if (fl_k == &fl_kernels_avx512) return evex;
    if (fl_k == &fl_kernels_avx2)
        return __builtin_cpu_supports("avxvnni") || (evex && __builtin_cpu_supports("avx512vl"));
    return 0;
#else
    return 0;
#endif
}

int fl_set_vnni(int on) {
    if (on && !fl_vnni_runs()) return -1;
    fl_vnni = on != 0;
    return 0;
}

int fl_amx = 0;

/* Whether Linux lets this process use AMX's tile data (asked for once: the permission is
 * the process's, for all its threads). */
static int amx_permitted(void) {
#if FL_X86 && defined(__linux__) && defined(SYS_arch_prctl)
    static int permitted = -1;
    if (permitted < 0) {
        unsigned long bits = 0;
        const long get_perm = 0x1022, req_perm = 0x1023, xtiledata = 18;  /* asm/prctl.h */
        if (syscall(SYS_arch_prctl, get_perm, &bits) == 0 && (bits & (1UL << xtiledata)))
            permitted = 1;
        else
            permitted = syscall(SYS_arch_prctl, req_perm, xtiledata) == 0;
    }
    return permitted;
#else
    return 0;
#endif
}

int fl_amx_runs(void) {
#if FL_X86
    if (fl_k != &fl_kernels_avx512 || !fl_vnni_runs()) return 0;
    __builtin_cpu_init();
    return __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-int8") && amx_permitted();
#else
    return 0;
#endif
}

int fl_set_amx(int on) {
    if (on && !fl_amx_runs()) return -1;
    fl_amx = on != 0;
    return 0;
}

/* 512 KiB: AMD Zen 3's L2, the smallest of the hosts seen. */
#define FL_L2_DEFAULT (INT64_C(512) << 10)

int64_t fl_l2_bytes(void) {
    static int64_t bytes = 0; /* every thread computes the same value: a race writes it alike */
    if (!bytes) {
        long got = -1;
#ifdef _SC_LEVEL2_CACHE_SIZE
        got = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
        bytes = got >= (64L << 10) ? (int64_t)got : FL_L2_DEFAULT;
    }
    return bytes;
}

int fl_set_isa(const char *name) {
    if (!fl_isa_runs(name)) return -1;
    fl_k = table_of(name);
    fl_vnni = fl_vnni_runs();
    fl_amx = fl_amx_runs();
#if FL_X86
    fl_vnni_vex = __builtin_cpu_supports("avxvnni");
#endif
    return 0;
}
