/* numpy's allocator handler (NEP 49) on the block arena of arena.h, for _core.pyx. */
#ifndef FL_ARENA_NUMPY_H
#define FL_ARENA_NUMPY_H
#include <numpy/ndarraytypes.h>

#include "arena.h"

static PyDataMem_Handler fl_arena_handler = {
    "fastlayers_arena",
    1,
    {NULL, fl_arena_malloc, fl_arena_calloc, fl_arena_realloc, fl_arena_free},
};

static void *fl_arena_handler_address(void) { return &fl_arena_handler; }
#endif
