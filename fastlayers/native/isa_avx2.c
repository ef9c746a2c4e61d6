/* The kernels compiled for the avx2 path (setup.py gives this file its compiler flags). */
#define FL_ISA_AVX2 1
#include "kernels.inc"
