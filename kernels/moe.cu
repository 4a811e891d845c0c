// A mixture of experts' steps between its products (model::gpu, `GpuFfn::Experts`). The router's scores go
// down, the host picks each token's experts (moe::route) and sends up three lists of t * n_used entries,
// grouped by expert, each expert's entries in token order: `rows` (the entry's token, for gather_rows_f32),
// `slots` (where its output goes: token * n_used + rank) and `weights` (its weight in the token's sum).
// d = n_embd.
#include "common.cuh"

// dst[slots[i]][j] = src[i][j] * weights[i]: an expert's outputs src (n, d), weighted, put by (token, rank)
// into dst (t * n_used, d). One block per entry.
extern "C" __global__ void moe_scatter_f32(const float *src, float *dst, const int *slots, const float *weights, int d) {
    const float *s = src + (long long)blockIdx.x * d;
    float *o = dst + (long long)slots[blockIdx.x] * d;
    float w = weights[blockIdx.x];
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        o[j] = s[j] * w;
    }
}

// out[t][j] = outs[t][0][j] + outs[t][1][j] + ... in rank order (best expert first, as the CPU adds them):
// outs (tokens, n_used, d), out (tokens, d), `total` = tokens * d. One thread per value.
extern "C" __global__ void moe_sum_f32(const float *outs, float *out, int n_used, int d, int total) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) {
        int t = i / d, j = i % d;
        const float *p = outs + (long long)t * n_used * d + j;
        float acc = p[0];
        for (int r = 1; r < n_used; r++) {
            acc += p[(long long)r * d];
        }
        out[i] = acc;
    }
}
