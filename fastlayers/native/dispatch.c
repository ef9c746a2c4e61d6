/* Runtime ISA dispatch (dispatch.h): the kernel tables of isa_*.c and CPUID. */
#include "dispatch.h"

#include <string.h>

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

int fl_set_isa(const char *name) {
    if (!fl_isa_runs(name)) return -1;
    fl_k = table_of(name);
    fl_vnni = fl_vnni_runs();
#if FL_X86
    fl_vnni_vex = __builtin_cpu_supports("avxvnni");
#endif
    return 0;
}
