// Element-wise steps of a layer. One thread per value; shapes are flat unless said otherwise.
#include "common.cuh"

// x[r][i] += b[i]: a bias added to every row. x (rows, n), `total` = rows * n.
extern "C" __global__ void add_bias_f32(float *x, const float *b, int n, int total) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) {
        x[i] += b[i % n];
    }
}

// SwiGLU: g[i] = silu(g[i]) * u[i].
extern "C" __global__ void swiglu_f32(float *g, const float *u, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = g[i];
        g[i] = v / (1.0f + expf(-v)) * u[i];
    }
}

// gpt-oss's clamped SwiGLU, as the CPU's `ops::glu` writes it: v = min(g[i], 7), y = u[i] clamped to [-7, 7]
// (a NaN stays NaN in both), g[i] = v * sigmoid(1.702 v) * (y + 1), the sigmoid from e = exp(-|z|).
extern "C" __global__ void swiglu_oai_f32(float *g, const float *u, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = g[i] > 7.0f ? 7.0f : g[i];
        float y = u[i] < -7.0f ? -7.0f : (u[i] > 7.0f ? 7.0f : u[i]);
        float z = 1.702f * v;
        float e = expf(-fabsf(z));
        float s = z >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
        g[i] = v * s * (y + 1.0f);
    }
}

// GeGLU: g[i] = gelu(g[i]) * u[i], GELU in its tanh form written as the CPU's `ops::glu` writes it:
// gelu(v) = v * sigmoid(2c v (1 + a v^2)), c = sqrt(2/pi), a = 0.044715, the sigmoid from e = exp(-|z|) as
// 1 / (1 + e) or e / (1 + e) (no overflow at either end).
extern "C" __global__ void geglu_f32(float *g, const float *u, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = g[i];
        float z = 1.595769f * v * (1.0f + 0.044715f * v * v);
        float e = expf(-fabsf(z));
        float s = z >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
        g[i] = v * s * u[i];
    }
}

// x[i] *= s (Gemma's embeddings times sqrt(n_embd)).
extern "C" __global__ void scale_f32(float *x, float s, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        x[i] *= s;
    }
}

// x[i] = c * tanh(x[i] / c): a soft-cap (Gemma 2's final logits).
extern "C" __global__ void softcap_f32(float *x, float c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        x[i] = c * tanhf(x[i] / c);
    }
}

// out[i] = x[idx[i]]: rows of n values picked by index (the positions whose logits are wanted).
// One block per output row.
extern "C" __global__ void gather_rows_f32(const float *x, const int *idx, float *out, int n) {
    const float *src = x + (long long)idx[blockIdx.x] * n;
    float *dst = out + (long long)blockIdx.x * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        dst[i] = src[i];
    }
}

// RoPE on the query heads q (tokens, n_head * head_dim) and the key heads k (tokens, n_head_kv * head_dim) in one
// launch, rotating the first `rope_dims` of each head, for tokens at positions pos0, pos0 + 1, ... Pairs are
// (2i, 2i + 1) for norm RoPE (llama) and (i, i + rope_dims/2) for neox RoPE (qwen2). Pair i turns by
// freq_scale * (pos * theta_scale^i / factors[i]) (`factors` null: 1), with pos * theta_scale^i by repeated
// multiplication as the CPU and ggml compute it, its cosine and sine times mscale (LongRoPE's attention
// factor). With yarn, YaRN blends each angle toward the unscaled one by a ramp over the correction dims
// (yarn_low, yarn_high) and scales cos and sin by 1 + 0.1 ln(1 / freq_scale), as the CPU's rope_table.
// One thread per (token, head, pair), query heads first.
extern "C" __global__ void rope_f32(float *q, float *k, const float *factors, int tokens, int n_head, int n_head_kv,
                                    int head_dim, int rope_dims, int pos0, float theta_scale, float freq_scale,
                                    float mscale, int neox, int yarn, float yarn_low, float yarn_high) {
    int half = rope_dims / 2, heads = n_head + n_head_kv;
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long total = (long long)tokens * heads * half;
    if (idx >= total) {
        return;
    }
    int i = (int)(idx % half);
    int h = (int)((idx / half) % heads);
    int t = (int)(idx / ((long long)half * heads));
    float theta = (float)(pos0 + t);
    for (int j = 0; j < i; j++) {
        theta *= theta_scale;
    }
    float extrap = theta / (factors ? factors[i] : 1.0f);
    float angle = freq_scale * extrap;
    if (yarn) {
        // YaRN (ggml's rope_yarn with ext_factor 1): blend toward the unscaled angle on the fast pairs.
        float y = ((float)i - yarn_low) / fmaxf(0.001f, yarn_high - yarn_low);
        float ramp = 1.0f - fminf(1.0f, fmaxf(0.0f, y));
        angle = angle * (1.0f - ramp) + extrap * ramp;
        mscale *= 1.0f + 0.1f * logf(1.0f / freq_scale);
    }
    float c = cosf(angle) * mscale, s = sinf(angle) * mscale;
    float *v = h < n_head ? q + ((long long)t * n_head + h) * head_dim
                          : k + ((long long)t * n_head_kv + (h - n_head)) * head_dim;
    int a = neox ? i : 2 * i;
    int b = neox ? i + half : 2 * i + 1;
    float x0 = v[a], x1 = v[b];
    v[a] = x0 * c - x1 * s;
    v[b] = x0 * s + x1 * c;
}
