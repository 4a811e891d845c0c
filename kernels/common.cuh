// Helpers every kernel shares: f16/bf16 conversion, little-endian loads from byte-packed blocks, warp sums.
// Compiled by NVRTC for the GPU and, with STRATA_EMU defined, as plain C++ by the CPU emulator (emu/), so
// device-only instructions sit behind `#ifndef STRATA_EMU` with a bit-exact C++ twin.
#pragma once

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ float bits_to_f32(u32 b) {
#ifndef STRATA_EMU
    return __uint_as_float(b);
#else
    float f;
    memcpy(&f, &b, 4);
    return f;
#endif
}

__device__ __forceinline__ u32 f32_to_bits(float f) {
#ifndef STRATA_EMU
    return __float_as_uint(f);
#else
    u32 b;
    memcpy(&b, &f, 4);
    return b;
#endif
}

#define NEG_INF (bits_to_f32(0xff800000u))

__device__ __forceinline__ float f16_to_f32(u16 h) {
#ifndef STRATA_EMU
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    u32 sign = (u32)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400));
        bits = sign | ((u32)(112 - e) << 23) | ((man & 0x3ff) << 13);
    }
    return bits_to_f32(bits);
#endif
}

// Round to nearest even, as `half::f16::from_f32` does on the CPU.
__device__ __forceinline__ u16 f32_to_f16(float f) {
#ifndef STRATA_EMU
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#else
    u32 x = f32_to_bits(f);
    u32 sign = (x >> 16) & 0x8000, exp = (x >> 23) & 0xff, man = x & 0x7fffff;
    if (exp == 0xff) {
        return (u16)(sign | 0x7c00 | (man ? 0x200 | (man >> 13) : 0));
    }
    int e = (int)exp - 127 + 15;
    if (e >= 0x1f) {
        return (u16)(sign | 0x7c00);
    }
    if (e <= 0) {
        if (e < -10) {
            return (u16)sign;
        }
        man |= 0x800000;
        int shift = 14 - e;
        u32 half_man = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half_man & 1))) {
            half_man++;
        }
        return (u16)(sign | half_man);
    }
    u32 h = sign | ((u32)e << 10) | (man >> 13), rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) {
        h++; // a carry into the exponent is the right result (up to infinity)
    }
    return (u16)h;
#endif
}

__device__ __forceinline__ float bf16_to_f32(u16 h) {
    return bits_to_f32((u32)h << 16);
}

__device__ __forceinline__ u16 load_u16(const u8 *p) {
    return (u16)p[0] | ((u16)p[1] << 8);
}

__device__ __forceinline__ u32 load_u32(const u8 *p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

__device__ __forceinline__ float load_f16(const u8 *p) {
    return f16_to_f32(load_u16(p));
}

// The sum of `v` over the warp, in every lane (butterfly order: the same on every lane).
__device__ __forceinline__ float warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, off);
    }
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int off = 16; off > 0; off >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    }
    return v;
}
