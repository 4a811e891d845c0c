// The CUDA dialect the kernels use, as plain C++ for the CPU emulator: the qualifiers vanish, shared memory
// is one copy per block (blocks run one at a time on an OS thread), and threadIdx / blockIdx / blockDim /
// gridDim, __syncthreads and warp shuffles come from the fiber scheduler in emu.cpp.
#pragma once

#include <math.h>
#include <string.h>

#define STRATA_EMU 1
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static thread_local

struct dim3 {
    unsigned x, y, z;
};

namespace emu {
const dim3 &thread_idx();
const dim3 &block_idx();
const dim3 &block_dim();
const dim3 &grid_dim();
void sync_block();
float shfl_xor(float v, int lane_mask);
} // namespace emu

#define threadIdx (emu::thread_idx())
#define blockIdx (emu::block_idx())
#define blockDim (emu::block_dim())
#define gridDim (emu::grid_dim())

inline void __syncthreads() {
    emu::sync_block();
}

// Every lane of the warp must call it (the kernels only shuffle with a full mask).
inline float __shfl_xor_sync(unsigned, float v, int lane_mask) {
    return emu::shfl_xor(v, lane_mask);
}
