// RMSNorm of rows: out[r][i] = x[r][i] / sqrt(mean(x[r]^2) + eps) * w[i].
// One block per row; the sum of squares is reduced in the block (any power-of-two block size up to 1024).
// Shapes: x, out (rows, n); w (n).

extern "C" __global__ void rms_norm_f32(const float *x, const float *w, float *out, int n, float eps) {
    extern __shared__ float partial[];
    const float *row = x + (size_t)blockIdx.x * n;
    float *dst = out + (size_t)blockIdx.x * n;
    float sum = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        sum += row[i] * row[i];
    }
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            partial[threadIdx.x] += partial[threadIdx.x + s];
        }
        __syncthreads();
    }
    const float scale = rsqrtf(partial[0] / n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        dst[i] = row[i] * scale * w[i];
    }
}
