// RMSNorm of rows: out[r][i] = x[r][i] / sqrt(mean(x[r]^2) + eps) * w[i] (`rms_norm_f32`; x may be out: the
// per-head q/k norms run in place over rows of head_dim), or added to out (`rms_norm_add_f32`: a post-norm's
// output joining the residual stream).
// One block per row of 256 threads; the sum of squares is reduced in the block.
// Shapes: x, out (rows, n); w (n).
#include "common.cuh"

#define NORM_THREADS 256

template <bool ADD>
__device__ __forceinline__ void rms_norm(const float *x, const float *w, float *out, int n, float eps) {
    __shared__ float partial[NORM_THREADS];
    const float *row = x + (long long)blockIdx.x * n;
    float *dst = out + (long long)blockIdx.x * n;
    float sum = 0.0f;
    for (int i = threadIdx.x; i < n; i += NORM_THREADS) {
        sum += row[i] * row[i];
    }
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int s = NORM_THREADS / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            partial[threadIdx.x] += partial[threadIdx.x + s];
        }
        __syncthreads();
    }
    const float scale = 1.0f / sqrtf(partial[0] / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += NORM_THREADS) {
        float v = row[i] * scale * w[i];
        dst[i] = ADD ? dst[i] + v : v;
    }
}

extern "C" __global__ void rms_norm_f32(const float *x, const float *w, float *out, int n, float eps) {
    rms_norm<false>(x, w, out, n, eps);
}

extern "C" __global__ void rms_norm_add_f32(const float *x, const float *w, float *out, int n, float eps) {
    rms_norm<true>(x, w, out, n, eps);
}
