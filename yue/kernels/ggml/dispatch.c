/* The ggml entry points (yue/kernels/ggml.py): each type's matmul and dequantizer by its ggml type id. */

int ggml_supported(int type) {
    switch (type) {
    case GGML_F32: case GGML_F16: case GGML_BF16: case GGML_Q4_0: case GGML_Q4_1: case GGML_Q5_0:
    case GGML_Q8_0: case GGML_Q4_K: case GGML_Q5_K: case GGML_Q6_K:
        return 1;
    default:
        return 0;
    }
}

/* y (rows, out) = x (rows, in) @ W^T, W `out` rows as the GGUF file stores them (in / block elements
 * blocks each); a type ggml_supported refuses leaves y as it is (the Python side checks first). */
void ggml_matmul(int type, const float *x, long rows, long in, const unsigned char *w, float *y, long out,
                 int threads) {
    switch (type) {
    case GGML_F32: float_matmul(GGML_F32, x, rows, in, w, y, out, threads); break;
    case GGML_F16: float_matmul(GGML_F16, x, rows, in, w, y, out, threads); break;
    case GGML_BF16: float_matmul(GGML_BF16, x, rows, in, w, y, out, threads); break;
    case GGML_Q4_0: q4_0_matmul(x, rows, in, w, y, out, threads); break;
    case GGML_Q4_1: q4_1_matmul(x, rows, in, w, y, out, threads); break;
    case GGML_Q5_0: q5_0_matmul(x, rows, in, w, y, out, threads); break;
    case GGML_Q8_0: q8_0_matmul(x, rows, in, w, y, out, threads); break;
    case GGML_Q4_K: q4_k_matmul(x, rows, in, w, y, out, threads); break;
    case GGML_Q5_K: q5_k_matmul(x, rows, in, w, y, out, threads); break;
    case GGML_Q6_K: q6_k_matmul(x, rows, in, w, y, out, threads); break;
    }
}

/* Rows ids[0..n) of W (each `in` wide) dequantized to float32 out (n, in), gguf.quants.dequantize's values. */
void ggml_get_rows(int type, const unsigned char *w, long in, const long *ids, long n, float *out) {
    switch (type) {
    case GGML_F32: case GGML_F16: case GGML_BF16: float_get_rows(type, w, in, ids, n, out); break;
    case GGML_Q4_0: blocks_get_rows(q4_0_dequant, Q32, Q4_0_BYTES, w, in, ids, n, out); break;
    case GGML_Q4_1: blocks_get_rows(q4_1_dequant, Q32, Q4_1_BYTES, w, in, ids, n, out); break;
    case GGML_Q5_0: blocks_get_rows(q5_0_dequant, Q32, Q5_0_BYTES, w, in, ids, n, out); break;
    case GGML_Q8_0: blocks_get_rows(q8_0_dequant, Q32, Q8_0_BYTES, w, in, ids, n, out); break;
    case GGML_Q4_K: blocks_get_rows(q4_k_dequant, QK, Q4_K_BYTES, w, in, ids, n, out); break;
    case GGML_Q5_K: blocks_get_rows(q5_k_dequant, QK, Q5_K_BYTES, w, in, ids, n, out); break;
    case GGML_Q6_K: blocks_get_rows(q6_k_dequant, QK, Q6_K_BYTES, w, in, ids, n, out); break;
    }
}

/* rows_layer's weight kind for a GGUF matrix of ggml type t is this + t (rowkernel.LAYER_KINDS' ggml part). */
int rows_layer_ggml_base(void) { return LAYER_GGML_BASE; }
