/* The kernels compiled for the avx512 path (setup.py gives this file its compiler flags). */
#define FL_ISA_AVX512 1
#include "kernels.inc"
