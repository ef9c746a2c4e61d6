/* The kernels compiled for the generic path (setup.py gives this file its compiler flags). */
#include "kernels.inc"
