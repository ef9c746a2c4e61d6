# Row kernels (rows.h).

cdef extern from "dispatch.h" nogil:
    int fl_bias_act(int64_t m, int64_t n, const float *x, int64_t ldx, const float *bias,
                    int code, float alpha, float *out, int64_t ldo)
    int fl_layer_norm(int64_t m, int64_t n, const float *x, const float *gamma,
                      const float *beta, float eps, int rms, float *out)
    int fl_scale_shift(int64_t m, int64_t n, const float *x, const float *scale,
                       const float *shift, float *out)

#: Activation names in the order of their codes (rows.h).
ACTIVATIONS = ("linear", "relu", "relu6", "leaky_relu", "hard_sigmoid", "softsign", "sigmoid",
               "silu", "gelu", "gelu_tanh", "exponential", "softmax", "log_softmax", "tanh")


def bias_act(cnp.ndarray x, object bias, int code, float alpha, cnp.ndarray out):
    """out = f(x + bias) over the rows of 2-D ``x`` and ``out`` (out may be x; rows any
    stride), f the activation ``code``; softmax codes normalize each row."""
    cdef int64_t m = x.shape[0], n = x.shape[1]
    cdef float *xp = fptr(x, "bias_act x")
    cdef float *op = fptr(out, "bias_act out")
    cdef float *bp = optf(bias, "bias_act bias")
    cdef int64_t ldx = ld(x), ldo = ld(out)
    cdef int st
    with nogil:
        st = fl_bias_act(m, n, xp, ldx, bp, code, alpha, op, ldo)
    check(st, "bias_act")
    return out


def layer_norm(cnp.ndarray x, object gamma, object beta, float eps, bint rms, cnp.ndarray out):
    """out[i] = gamma (x[i] - mean) / sqrt(var + eps) + beta (rms: gamma x[i] / rms(x[i]))
    over C-contiguous rows (out may be x)."""
    cdef int64_t m = x.shape[0], n = x.shape[1]
    cdef float *xp = fptr(x, "layer_norm x")
    cdef float *op = fptr(out, "layer_norm out")
    cdef float *gp = optf(gamma, "layer_norm gamma")
    cdef float *bp = optf(beta, "layer_norm beta")
    cdef int st
    with nogil:
        st = fl_layer_norm(m, n, xp, gp, bp, eps, rms, op)
    check(st, "layer_norm")
    return out


def scale_shift(cnp.ndarray x, cnp.ndarray scale, cnp.ndarray shift, cnp.ndarray out):
    """out[i, c] = x[i, c] scale[c] + shift[c] over C-contiguous rows."""
    cdef int64_t m = x.shape[0], n = x.shape[1]
    cdef float *xp = fptr(x, "scale_shift x")
    cdef float *op = fptr(out, "scale_shift out")
    cdef float *sp = fptr(scale, "scale_shift scale")
    cdef float *hp = fptr(shift, "scale_shift shift")
    cdef int st
    with nogil:
        st = fl_scale_shift(m, n, xp, sp, hp, op)
    check(st, "scale_shift")
    return out
