# Elementwise programs (elementwise.h).

cdef extern from "elementwise.h" nogil:
    enum:
        FL_EW_FULL
        FL_EW_CHANNEL
        FL_EW_SCALAR
        FL_EW_POSITION
    ctypedef struct fl_ew_operand:
        int kind
        const float *p
        int64_t stride
    ctypedef struct fl_ew_insn:
        int op, dst, a, b, code
        float alpha, x, y

cdef extern from "dispatch.h" nogil:
    int fl_elementwise(int64_t samples, int64_t inner, int64_t c, int n_operands,
                       const fl_ew_operand *operands, int n_insns, const fl_ew_insn *insns,
                       int n_regs, float *out)

#: Operation names of elementwise programs, in the order of their codes (elementwise.h).
EW_OPS = ("add", "sub", "mul", "div", "act", "sqrt", "neg", "abs", "clip")
#: Operand kinds (elementwise.h): a tensor of the output's shape, a channel vector, one value,
#: one value per position (over its channels).
EW_FULL, EW_CHANNEL, EW_SCALAR, EW_POSITION = 0, 1, 2, 3


def ew_operand_floats(int kind, int64_t samples, int64_t inner, int64_t c, int64_t stride):
    """The fewest values an operand of ``kind`` (elementwise.h) holds for a call over samples
    x inner values of c channels with the sample stride ``stride``; -1 for an unknown kind or
    no channels."""
    if c < 1:
        return -1
    if kind == EW_FULL:
        return samples * inner
    if kind == EW_CHANNEL:
        return (samples - 1) * stride + c
    if kind == EW_SCALAR:
        return 1
    if kind == EW_POSITION:
        return (samples - 1) * stride + inner // c
    return -1


cdef class ElementwiseProgram:
    """A chain of elementwise operations run in one pass over memory (``elementwise.h``).

    ``insns``: (op name, dst register, a, b, activation code, alpha, lo, hi) per instruction, a
    and b an operand index (>= 0) or the register -1 - r; ``registers``: how many registers the
    instructions use; ``operands``: how many operands a call passes. Calling it with
    ``(samples, inner, c, operands, out)`` writes out[n * inner + j] for every sample and
    position, ``operands`` being (kind, float32 array, sample stride in floats) each: a FULL
    operand an array of samples * inner values whose samples are ``stride`` apart from its
    first value, each sample's values contiguous (a view of its memory, checked only for its
    count of values), a channel vector, a value or the values of the positions (inner / c per
    sample) C-contiguous."""

    cdef fl_ew_insn *insns
    cdef int n_insns, n_regs, n_operands

    def __cinit__(self, list insns, int registers, int operands):
        if not insns:
            raise ValueError("ElementwiseProgram: no instructions")
        self.insns = <fl_ew_insn *>PyMem_Malloc(len(insns) * sizeof(fl_ew_insn))
        if self.insns == NULL:
            raise MemoryError("ElementwiseProgram: its instructions could not be allocated")
        self.n_insns, self.n_regs, self.n_operands = len(insns), registers, operands
        cdef int i = 0
        for op, dst, a, b, code, alpha, lo, hi in insns:
            if op not in EW_OPS or not (-registers <= a < operands) or not (-registers <= b < operands) \
                    or not 0 <= dst < max(registers, 1):
                raise ValueError(f"ElementwiseProgram: instruction {i} {(op, dst, a, b)} out of range")
            self.insns[i].op = EW_OPS.index(op)
            self.insns[i].dst, self.insns[i].a, self.insns[i].b, self.insns[i].code = dst, a, b, code
            self.insns[i].alpha, self.insns[i].x, self.insns[i].y = alpha, lo, hi
            i += 1

    def __dealloc__(self):
        PyMem_Free(self.insns)

    def __call__(self, int64_t samples, int64_t inner, int64_t c, list operands, cnp.ndarray out):
        if len(operands) != self.n_operands:
            raise ValueError(f"ElementwiseProgram: {len(operands)} operands for {self.n_operands}")
        if (cnp.PyArray_TYPE(out) != cnp.NPY_FLOAT32 or not cnp.PyArray_IS_C_CONTIGUOUS(out)
                or out.size != samples * inner):
            raise ValueError("ElementwiseProgram: out must be C-contiguous float32 of samples * inner values")
        cdef fl_ew_operand *ops = <fl_ew_operand *>PyMem_Malloc(max(self.n_operands, 1) * sizeof(fl_ew_operand))
        if ops == NULL:
            raise MemoryError("ElementwiseProgram: a call's operands could not be allocated")
        cdef int i = 0, st
        cdef cnp.ndarray a
        cdef float *op = <float *>cnp.PyArray_DATA(out)
        try:
            for kind, value, stride in operands:
                a = <cnp.ndarray>value
                if cnp.PyArray_TYPE(a) != cnp.NPY_FLOAT32 or (kind != EW_FULL and not cnp.PyArray_IS_C_CONTIGUOUS(a)):
                    raise ValueError(f"ElementwiseProgram: operand {i} is not float32 (C-contiguous where not FULL)")
                need = ew_operand_floats(kind, samples, inner, c, stride)
                if need < 0 or stride < 0:
                    raise ValueError(f"ElementwiseProgram: operand {i} of kind {kind} with stride {stride}")
                if a.size < need or (kind == EW_FULL and a.size != need):
                    raise ValueError(f"ElementwiseProgram: operand {i} holds {a.size} values, needs {need}")
                ops[i].kind, ops[i].p, ops[i].stride = kind, <const float *>cnp.PyArray_DATA(a), stride
                i += 1
            with nogil:
                st = fl_elementwise(samples, inner, c, self.n_operands, ops, self.n_insns, self.insns,
                                    self.n_regs, op)
        finally:
            PyMem_Free(ops)
        check(st, "elementwise program")
        return out
