// Matrix-vector products for decode: y[r] = sum_c W[r][c] * x[c] (+ y[r] when accumulate), with W in a ggml
// block format read as stored and x in f32 (the exact activations, no 8-bit quantization on the GPU).
// One warp per row: lanes take blocks in turn, then a warp reduction. Launch with blockDim.x a multiple of
// 32 and gridDim.x = ceil(rows / (blockDim.x / 32)).
// Shapes: W (rows, cols) as `row_bytes` bytes per row; x (cols); y (rows). cols is a multiple of 32.

__device__ __forceinline__ float f16_to_f32(unsigned short bits) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(bits));
    return f;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) {
        v += __shfl_down_sync(0xffffffffu, v, off);
    }
    return v;
}

__device__ __forceinline__ unsigned short load_u16(const unsigned char *p) {
    return (unsigned short)p[0] | ((unsigned short)p[1] << 8);
}

// f16 rows: 2 bytes per value.
extern "C" __global__ void matvec_f16_f32(const unsigned char *w, const float *x, float *y, int rows, int cols,
                                          long long row_bytes) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) {
        return;
    }
    const unsigned char *wr = w + row * row_bytes;
    float acc = 0.0f;
    for (int c = lane; c < cols; c += 32) {
        acc += f16_to_f32(load_u16(wr + 2 * c)) * x[c];
    }
    acc = warp_sum(acc);
    if (lane == 0) {
        y[row] = acc;
    }
}

// Q8_0 blocks of 32 values: f16 scale d, then 32 int8: value = d * q.
extern "C" __global__ void matvec_q8_0_f32(const unsigned char *w, const float *x, float *y, int rows, int cols,
                                           long long row_bytes) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) {
        return;
    }
    const unsigned char *wr = w + row * row_bytes;
    int blocks = cols / 32;
    float acc = 0.0f;
    for (int b = lane; b < blocks; b += 32) {
        const unsigned char *blk = wr + b * 34;
        float d = f16_to_f32(load_u16(blk));
        const signed char *q = (const signed char *)(blk + 2);
        const float *xb = x + b * 32;
        float s = 0.0f;
        for (int j = 0; j < 32; j++) {
            s += (float)q[j] * xb[j];
        }
        acc += d * s;
    }
    acc = warp_sum(acc);
    if (lane == 0) {
        y[row] = acc;
    }
}

// Q4_1 blocks of 32 values: f16 scale d, f16 minimum m, 16 bytes of nibbles: value j = (qs[j] & 15) * d + m,
// value j + 16 = (qs[j] >> 4) * d + m.
extern "C" __global__ void matvec_q4_1_f32(const unsigned char *w, const float *x, float *y, int rows, int cols,
                                           long long row_bytes) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) {
        return;
    }
    const unsigned char *wr = w + row * row_bytes;
    int blocks = cols / 32;
    float acc = 0.0f;
    for (int b = lane; b < blocks; b += 32) {
        const unsigned char *blk = wr + b * 20;
        float d = f16_to_f32(load_u16(blk));
        float m = f16_to_f32(load_u16(blk + 2));
        const unsigned char *qs = blk + 4;
        const float *xb = x + b * 32;
        float s = 0.0f, sx = 0.0f;
        for (int j = 0; j < 16; j++) {
            s += (float)(qs[j] & 15) * xb[j] + (float)(qs[j] >> 4) * xb[j + 16];
            sx += xb[j] + xb[j + 16];
        }
        acc += d * s + m * sx;
    }
    acc = warp_sum(acc);
    if (lane == 0) {
        y[row] = acc;
    }
}
