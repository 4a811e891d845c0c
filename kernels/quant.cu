// Products with weights in a ggml format, read as stored (no dequantized copy in memory), against exact f32
// activations: `matvec_T` for one token (decode), `gemm_T` for a batch (prompts), `rows_T` to dequantize
// chosen rows (the embedding lookup). With `accumulate`, the products add to y (y += W x: the residual
// stream takes a projection without a separate add). T is one of f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K,
// q6_K, iq4_nl, mxfp4 (gpt-oss's experts): every weight type the CPU reads but q2_K, q3_K and iq4_xs.
// Shapes: W (rows, cols) stored as `row_bytes` bytes per row, cols a multiple of 32 (of 256 for K-quants);
// x (tokens, cols); y (tokens, rows).
#include "common.cuh"

// ggml type ids.
#define T_F32 0
#define T_F16 1
#define T_Q4_0 2
#define T_Q4_1 3
#define T_Q5_0 6
#define T_Q5_1 7
#define T_Q8_0 8
#define T_Q4_K 12
#define T_Q5_K 13
#define T_Q6_K 14
#define T_IQ4_NL 20
#define T_BF16 30
#define T_MXFP4 39

// The scale and minimum of sub-block j of a q4_K / q5_K block's 12 packed scale bytes.
__device__ __forceinline__ void scale_min_k4(int j, const u8 *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Entry i (0..16) of iq4_nl's levels (ggml's kvalues_iq4nl: -127 -104 -83 -65 -49 -35 -22 -10 1 13 25 38 53 69
// 89 113), packed a byte each into two 64-bit words.
__device__ __forceinline__ int iq4nl_level(int i) {
    unsigned long long w = i < 8 ? 0xf6eaddcfbfad9881ull : 0x7159453526190d01ull;
    return (int)(signed char)((w >> (8 * (i & 7))) & 0xFF);
}

// Entry i (0..16) of mxfp4's levels (ggml's kvalues_mxfp4, the e2m1 values doubled: 0 1 2 3 4 6 8 12, then the
// same negated), the magnitudes packed a nibble each.
__device__ __forceinline__ int mxfp4_level(int i) {
    int v = (int)((0xC8643210u >> (4 * (i & 7))) & 0xF);
    return i & 8 ? -v : v;
}

// Half the e8m0 scale, 2^(e - 128), from its bits as ggml's ggml_e8m0_to_fp32_half (e = 0 and 1 subnormal).
__device__ __forceinline__ float e8m0_half(u8 e) {
    u32 bits = e < 2 ? (0x00200000u << e) : ((u32)(e - 1) << 23);
    return bits_to_f32(bits);
}

// Values 32c .. 32c + 31 of a row (its chunk c) into out[0..32), with ggml's float operations.
template <int T> __device__ __forceinline__ void dequant32(const u8 *row, int c, float *out) {
    if constexpr (T == T_F32) {
        const u8 *p = row + (long long)c * 128;
        for (int j = 0; j < 32; j++) out[j] = bits_to_f32(load_u32(p + 4 * j));
    } else if constexpr (T == T_F16) {
        const u8 *p = row + (long long)c * 64;
        for (int j = 0; j < 32; j++) out[j] = load_f16(p + 2 * j);
    } else if constexpr (T == T_BF16) {
        const u8 *p = row + (long long)c * 64;
        for (int j = 0; j < 32; j++) out[j] = bf16_to_f32(load_u16(p + 2 * j));
    } else if constexpr (T == T_Q4_0) {
        const u8 *b = row + (long long)c * 18;
        float d = load_f16(b);
        for (int j = 0; j < 16; j++) {
            out[j] = (float)((b[2 + j] & 0xF) - 8) * d;
            out[j + 16] = (float)((b[2 + j] >> 4) - 8) * d;
        }
    } else if constexpr (T == T_Q4_1) {
        const u8 *b = row + (long long)c * 20;
        float d = load_f16(b), m = load_f16(b + 2);
        for (int j = 0; j < 16; j++) {
            out[j] = (float)(b[4 + j] & 0xF) * d + m;
            out[j + 16] = (float)(b[4 + j] >> 4) * d + m;
        }
    } else if constexpr (T == T_Q5_0) {
        const u8 *b = row + (long long)c * 22;
        float d = load_f16(b);
        u32 qh = load_u32(b + 2);
        for (int j = 0; j < 16; j++) {
            u32 q = b[6 + j], h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
            out[j] = (float)((int)((q & 0xF) | h0) - 16) * d;
            out[j + 16] = (float)((int)((q >> 4) | h1) - 16) * d;
        }
    } else if constexpr (T == T_Q5_1) {
        const u8 *b = row + (long long)c * 24;
        float d = load_f16(b), m = load_f16(b + 2);
        u32 qh = load_u32(b + 4);
        for (int j = 0; j < 16; j++) {
            u32 q = b[8 + j], h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
            out[j] = (float)((q & 0xF) | h0) * d + m;
            out[j + 16] = (float)((q >> 4) | h1) * d + m;
        }
    } else if constexpr (T == T_IQ4_NL) {
        const u8 *b = row + (long long)c * 18;
        float d = load_f16(b);
        for (int j = 0; j < 16; j++) {
            out[j] = d * (float)iq4nl_level(b[2 + j] & 0xF);
            out[j + 16] = d * (float)iq4nl_level(b[2 + j] >> 4);
        }
    } else if constexpr (T == T_MXFP4) {
        const u8 *b = row + (long long)c * 17;
        float d = e8m0_half(b[0]);
        for (int j = 0; j < 16; j++) {
            out[j] = (float)mxfp4_level(b[1 + j] & 0xF) * d;
            out[j + 16] = (float)mxfp4_level(b[1 + j] >> 4) * d;
        }
    } else if constexpr (T == T_Q8_0) {
        const u8 *b = row + (long long)c * 34;
        float d = load_f16(b);
        for (int j = 0; j < 32; j++) out[j] = (float)(signed char)b[2 + j] * d;
    } else if constexpr (T == T_Q4_K || T == T_Q5_K) {
        // Super-blocks of 256 values in 8 sub-blocks of 32; sub-block k takes the low (even k) or high (odd
        // k) nibbles of 32 bytes, and q5_K bit k of each qh byte.
        const int k = c % 8;
        const u8 *b = row + (long long)(c / 8) * (T == T_Q4_K ? 144 : 176);
        float d = load_f16(b), dmin = load_f16(b + 2);
        int sc, mn;
        scale_min_k4(k, b + 4, &sc, &mn);
        float d1 = d * (float)sc, m1 = dmin * (float)mn;
        const u8 *q = b + (T == T_Q4_K ? 16 : 48) + 32 * (k / 2);
        int shift = 4 * (k & 1);
        for (int l = 0; l < 32; l++) {
            int v = (q[l] >> shift) & 0xF;
            if constexpr (T == T_Q5_K) {
                v += (b[16 + l] & (1 << k)) ? 16 : 0;
            }
            out[l] = d1 * (float)v - m1;
        }
    } else if constexpr (T == T_Q6_K) {
        // Two halves of 128 values; sub-block kk of a half reads the low (kk < 2) or high nibbles of ql at
        // l + 32 * (kk & 1) and bits 2kk of qh.
        const int k = c % 8, h = k / 4, kk = k % 4;
        const u8 *b = row + (long long)(c / 8) * 210;
        float d = load_f16(b + 208);
        const u8 *ql = b + 64 * h, *qh = b + 128 + 32 * h, *sc = b + 192 + 8 * h;
        for (int l = 0; l < 32; l++) {
            int q = ((ql[l + 32 * (kk & 1)] >> (4 * (kk >> 1))) & 0xF) | (((qh[l] >> (2 * kk)) & 3) << 4);
            out[l] = d * (float)(signed char)sc[l / 16 + 2 * kk] * (float)(q - 32);
        }
    }
}

// One warp per row, lanes taking 32-value chunks in turn. blockDim.x a multiple of 32.
template <int T>
__device__ __forceinline__ void matvec(const u8 *w, const float *x, float *y, int rows, int cols, long long row_bytes,
                                       int accumulate) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) {
        return; // the whole warp leaves together
    }
    const u8 *wr = w + row * row_bytes;
    float acc = 0.0f, v[32];
    for (int c = lane; c < cols / 32; c += 32) {
        dequant32<T>(wr, c, v);
        const float *xc = x + c * 32;
        float s = 0.0f;
        for (int j = 0; j < 32; j++) s += v[j] * xc[j];
        acc += s;
    }
    acc = warp_sum(acc);
    if (lane == 0) {
        y[row] = accumulate ? y[row] + acc : acc;
    }
}

// Tokens one warp of `matvec_many` takes.
#define MATVEC_MANY 8

// `matvec` for several tokens, each exactly as `matvec` computes it alone (the same lanes, chunks, order and
// warp sum), so a decoded token gets the same bits whatever tokens of other sequences share its launch: one
// warp per row, the row's chunks dequantized once for up to MATVEC_MANY tokens. Grid
// (ceil(rows / warps per block), ceil(tokens / MATVEC_MANY)).
template <int T>
__device__ __forceinline__ void matvec_many(const u8 *w, const float *x, float *y, int rows, int cols,
                                            long long row_bytes, int tokens, int accumulate) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) {
        return; // the whole warp leaves together
    }
    const int t0 = blockIdx.y * MATVEC_MANY;
    const int nt = tokens - t0 < MATVEC_MANY ? tokens - t0 : MATVEC_MANY;
    const u8 *wr = w + row * row_bytes;
    float acc[MATVEC_MANY], v[32];
    for (int t = 0; t < MATVEC_MANY; t++) acc[t] = 0.0f;
    for (int c = lane; c < cols / 32; c += 32) {
        dequant32<T>(wr, c, v);
        for (int t = 0; t < nt; t++) {
            const float *xc = x + (long long)(t0 + t) * cols + c * 32;
            float s = 0.0f;
            for (int j = 0; j < 32; j++) s += v[j] * xc[j];
            acc[t] += s;
        }
    }
    for (int t = 0; t < nt; t++) {
        float a = warp_sum(acc[t]);
        if (lane == 0) {
            long long at = (long long)(t0 + t) * rows + row;
            y[at] = accumulate ? y[at] + a : a;
        }
    }
}

#define GEMM_TILE 32

// Tiles of 32 rows x 32 tokens per block of 256 threads, each thread 2 x 2 outputs; the weights of a tile
// are dequantized once into shared memory. Grid (ceil(rows / 32), ceil(tokens / 32)).
template <int T>
__device__ __forceinline__ void gemm(const u8 *w, const float *x, float *y, int rows, int cols, long long row_bytes,
                                     int tokens, int accumulate) {
    __shared__ float ws[GEMM_TILE][GEMM_TILE + 1]; // (row, k)
    __shared__ float xs[GEMM_TILE][GEMM_TILE + 1]; // (token, k)
    const int r0 = blockIdx.x * GEMM_TILE, t0 = blockIdx.y * GEMM_TILE;
    const int tid = threadIdx.x, tr = tid % 16, tt = tid / 16;
    float acc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
    for (int c = 0; c < cols / 32; c++) {
        if (tid < GEMM_TILE) {
            if (r0 + tid < rows) {
                dequant32<T>(w + (r0 + tid) * row_bytes, c, ws[tid]);
            } else {
                for (int k = 0; k < 32; k++) ws[tid][k] = 0.0f;
            }
        }
        for (int i = tid; i < GEMM_TILE * 32; i += blockDim.x) {
            int t = i / 32, k = i % 32;
            xs[t][k] = t0 + t < tokens ? x[(long long)(t0 + t) * cols + c * 32 + k] : 0.0f;
        }
        __syncthreads();
        for (int k = 0; k < 32; k++) {
            for (int a = 0; a < 2; a++) {
                for (int b = 0; b < 2; b++) acc[a][b] += ws[tr * 2 + a][k] * xs[tt * 2 + b][k];
            }
        }
        __syncthreads();
    }
    for (int a = 0; a < 2; a++) {
        for (int b = 0; b < 2; b++) {
            int r = r0 + tr * 2 + a, t = t0 + tt * 2 + b;
            if (r < rows && t < tokens) {
                long long at = (long long)t * rows + r;
                y[at] = accumulate ? y[at] + acc[a][b] : acc[a][b];
            }
        }
    }
}

// out[i] = row ids[i] of W, dequantized. One block per id.
template <int T>
__device__ __forceinline__ void rows(const u8 *w, const int *ids, float *out, int cols, long long row_bytes) {
    const u8 *wr = w + ids[blockIdx.x] * row_bytes;
    for (int c = threadIdx.x; c < cols / 32; c += blockDim.x) {
        dequant32<T>(wr, c, out + (long long)blockIdx.x * cols + c * 32);
    }
}

#define QUANT_KERNELS(NAME, T)                                                                                     \
    extern "C" __global__ void matvec_##NAME(const u8 *w, const float *x, float *y, int rows_, int cols,           \
                                             long long row_bytes, int accumulate) {                               \
        matvec<T>(w, x, y, rows_, cols, row_bytes, accumulate);                                                   \
    }                                                                                                             \
    extern "C" __global__ void matvec_many_##NAME(const u8 *w, const float *x, float *y, int rows_, int cols,      \
                                                  long long row_bytes, int tokens, int accumulate) {               \
        matvec_many<T>(w, x, y, rows_, cols, row_bytes, tokens, accumulate);                                       \
    }                                                                                                             \
    extern "C" __global__ void gemm_##NAME(const u8 *w, const float *x, float *y, int rows_, int cols,             \
                                           long long row_bytes, int tokens, int accumulate) {                     \
        gemm<T>(w, x, y, rows_, cols, row_bytes, tokens, accumulate);                                             \
    }                                                                                                             \
    extern "C" __global__ void rows_##NAME(const u8 *w, const int *ids, float *out, int cols, long long row_bytes) { \
        rows<T>(w, ids, out, cols, row_bytes);                                                                    \
    }

QUANT_KERNELS(f32, T_F32)
QUANT_KERNELS(f16, T_F16)
QUANT_KERNELS(bf16, T_BF16)
QUANT_KERNELS(q8_0, T_Q8_0)
QUANT_KERNELS(q4_0, T_Q4_0)
QUANT_KERNELS(q4_1, T_Q4_1)
QUANT_KERNELS(q5_0, T_Q5_0)
QUANT_KERNELS(q5_1, T_Q5_1)
QUANT_KERNELS(q4_K, T_Q4_K)
QUANT_KERNELS(q5_K, T_Q5_K)
QUANT_KERNELS(q6_K, T_Q6_K)
QUANT_KERNELS(iq4_nl, T_IQ4_NL)
QUANT_KERNELS(mxfp4, T_MXFP4)
