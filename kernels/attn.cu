// The KV cache on the GPU: storing a batch's K and V rows into pages, and attention over the pages.
// A layer's pages are listed in a page table (an array of addresses, page i holding positions 64i ..
// 64i + 63); a page may be device memory or pinned host memory mapped into the device's address space (the
// part `--kv-resident` keeps on the host), so one softmax covers both and where a page lives changes nothing.
// Rows are `kv_dim` values as f16, or as q8_0 blocks (f16 scale + 32 int8) for int8 KV.
#include "common.cuh"

#define PAGE_TOKENS 64
#define ATTN_WARPS 4
#define HEAD_DIM_MAX 256

// K rows k (tokens, kv_dim) and V rows v, f32, stored at positions pos0 .. pos0 + tokens - 1 of the pages in
// k_pages and v_pages, as f16. One thread per value, K's first.
extern "C" __global__ void kv_store_f16(const float *k, const float *v, const u64 *k_pages, const u64 *v_pages,
                                        int tokens, int pos0, int kv_dim) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long n = (long long)tokens * kv_dim;
    if (idx >= 2 * n) {
        return;
    }
    bool is_v = idx >= n;
    long long i = is_v ? idx - n : idx;
    int t = (int)(i / kv_dim), d = (int)(i % kv_dim), pos = pos0 + t;
    u16 *page = (u16 *)(is_v ? v_pages : k_pages)[pos / PAGE_TOKENS];
    page[(long long)(pos % PAGE_TOKENS) * kv_dim + d] = f32_to_f16((is_v ? v : k)[i]);
}

// The same as q8_0 blocks, quantized as the CPU's activation quantizer does (d = amax / 127, q = round half
// to even of x * 127 / amax). One thread per block of 32 values, K's first.
extern "C" __global__ void kv_store_q8_0(const float *k, const float *v, const u64 *k_pages, const u64 *v_pages,
                                         int tokens, int pos0, int kv_dim) {
    int blocks = kv_dim / 32;
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long n = (long long)tokens * blocks;
    if (idx >= 2 * n) {
        return;
    }
    bool is_v = idx >= n;
    long long i = is_v ? idx - n : idx;
    const u64 *pages = is_v ? v_pages : k_pages;
    int t = (int)(i / blocks), blk = (int)(i % blocks), pos = pos0 + t;
    const float *x = (is_v ? v : k) + (long long)t * kv_dim + blk * 32;
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
    u8 *b = (u8 *)pages[pos / PAGE_TOKENS] + (long long)(pos % PAGE_TOKENS) * blocks * 34 + blk * 34;
    // One 16-bit store (a block starts at an even byte: rows and blocks are 34-byte multiples). Two byte stores
    // of the f16 register lost the low byte on an H200 (driver 580, PTX JIT for sm_90): the scale read back
    // with its low byte 0 on nearly every block.
    *(u16 *)b = f32_to_f16(d);
    for (int j = 0; j < 32; j++) {
        float q = rintf(x[j] * id);
        q = fminf(fmaxf(q, -128.0f), 127.0f);
        b[2 + j] = (u8)(signed char)(int)q;
    }
}

// Rows row0 .. row0 + rows of one side (K or V) of a layer's pages, listed in `table` (page i holds rows 64i ..
// 64i + 63 from its start), copied to dst one after another: parking a conversation, where dst is pinned host
// memory. One launch instead of a copy per page. Rows are row_bytes bytes, an even number; dst 2-byte aligned.
// One thread per 2 bytes.
extern "C" __global__ void kv_gather(const u64 *table, u8 *dst, int row0, int rows, int row_bytes) {
    const long long half = row_bytes / 2;
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)rows * half) {
        return;
    }
    int r = (int)(idx / half), c = (int)(idx % half), p = row0 + r;
    const u16 *src = (const u16 *)(table[p / PAGE_TOKENS] + (long long)(p % PAGE_TOKENS) * row_bytes);
    ((u16 *)dst)[idx] = src[c];
}

// Causal attention of the queries q (tokens, n_head * head_dim) at positions pos0 .. over one layer's pages,
// into out (same shape). One block of ATTN_WARPS warps per (token, head); warp w takes positions lo + w,
// lo + w + ATTN_WARPS, ... with an online softmax, lanes splitting the head's values (lane + 32i, the lanes past
// head_dim idle); the warps' partial results are merged by log-sum-exp at the end. head_dim at most
// HEAD_DIM_MAX (a multiple of 32 for int8 pages, whose q8_0 blocks must not straddle heads).
// A sliding-window layer (window > 0) attends to the query's position and the window - 1 before it: lo is
// pos + 1 - window, and the positions before it are never read (as the CPU gives them a weight of exactly
// 0). With softcap > 0 a score becomes softcap * tanh(score * scale / softcap) (Gemma 2), else score * scale.
// With sinks (n_head values, else null) head h's sink joins the softmax as one more score whose value is zero
// (gpt-oss): it enters the merge's max and adds e^(sink - max) to the sum.
template <bool INT8>
__device__ __forceinline__ void attention(const float *q, float *out, const u64 *k_pages, const u64 *v_pages,
                                          int pos0, int n_head, int n_head_kv, int head_dim, float scale, int window,
                                          float softcap, const float *sinks) {
    __shared__ float part_m[ATTN_WARPS], part_l[ATTN_WARPS];
    __shared__ float part_acc[ATTN_WARPS][HEAD_DIM_MAX];
    const int t = blockIdx.x / n_head, h = blockIdx.x % n_head, kvh = h / (n_head / n_head_kv);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, per_lane = (head_dim + 31) / 32;
    const int kv_dim = n_head_kv * head_dim, pos = pos0 + t;
    const int lo = window > 0 && pos + 1 > window ? pos + 1 - window : 0;
    const long long row_bytes = INT8 ? (long long)kv_dim / 32 * 34 : (long long)kv_dim * 2;
    const long long head_off = INT8 ? (long long)kvh * (head_dim / 32) * 34 : (long long)kvh * head_dim * 2;
    const float *qv = q + ((long long)t * n_head + h) * head_dim;
    float qr[HEAD_DIM_MAX / 32], acc[HEAD_DIM_MAX / 32];
    for (int i = 0; i < per_lane; i++) {
        qr[i] = lane + 32 * i < head_dim ? qv[lane + 32 * i] : 0.0f;
        acc[i] = 0.0f;
    }
    float m = NEG_INF, l = 0.0f;
    for (int p = lo + warp; p <= pos; p += ATTN_WARPS) {
        const long long at = (long long)(p % PAGE_TOKENS) * row_bytes + head_off;
        const u8 *kr = (const u8 *)k_pages[p / PAGE_TOKENS] + at;
        const u8 *vr = (const u8 *)v_pages[p / PAGE_TOKENS] + at;
        float s = 0.0f;
        for (int i = 0; i < per_lane; i++) {
            if (INT8) {
                s += qr[i] * (load_f16(kr + 34 * i) * (float)(signed char)kr[34 * i + 2 + lane]);
            } else if (lane + 32 * i < head_dim) {
                s += qr[i] * load_f16(kr + 2 * (lane + 32 * i));
            }
        }
        s = warp_sum(s);
        s = softcap > 0.0f ? softcap * tanhf(s * scale / softcap) : s * scale;
        float m_new = fmaxf(m, s);
        float corr = expf(m - m_new), e = expf(s - m_new);
        l = l * corr + e;
        for (int i = 0; i < per_lane; i++) {
            float v = 0.0f;
            if (INT8) {
                v = load_f16(vr + 34 * i) * (float)(signed char)vr[34 * i + 2 + lane];
            } else if (lane + 32 * i < head_dim) {
                v = load_f16(vr + 2 * (lane + 32 * i));
            }
            acc[i] = acc[i] * corr + e * v;
        }
        m = m_new;
    }
    if (lane == 0) {
        part_m[warp] = m;
        part_l[warp] = l;
    }
    for (int i = 0; i < per_lane; i++) {
        if (lane + 32 * i < head_dim) {
            part_acc[warp][lane + 32 * i] = acc[i];
        }
    }
    __syncthreads();
    if (warp == 0) {
        float mx = part_m[0]; // warp 0 always saw position lo
        for (int w = 1; w < ATTN_WARPS; w++) mx = fmaxf(mx, part_m[w]);
        if (sinks) {
            mx = fmaxf(mx, sinks[h]);
        }
        float sum = 0.0f, f[ATTN_WARPS];
        for (int w = 0; w < ATTN_WARPS; w++) {
            f[w] = part_l[w] > 0.0f ? expf(part_m[w] - mx) : 0.0f;
            sum += part_l[w] * f[w];
        }
        if (sinks) {
            sum += expf(sinks[h] - mx);
        }
        float *o = out + ((long long)t * n_head + h) * head_dim;
        for (int i = 0; i < per_lane; i++) {
            if (lane + 32 * i < head_dim) {
                float v = 0.0f;
                for (int w = 0; w < ATTN_WARPS; w++) v += part_acc[w][lane + 32 * i] * f[w];
                o[lane + 32 * i] = v / sum;
            }
        }
    }
}

extern "C" __global__ void attention_f16(const float *q, float *out, const u64 *k_pages, const u64 *v_pages, int pos0,
                                         int n_head, int n_head_kv, int head_dim, float scale, int window,
                                         float softcap, const float *sinks) {
    attention<false>(q, out, k_pages, v_pages, pos0, n_head, n_head_kv, head_dim, scale, window, softcap, sinks);
}

extern "C" __global__ void attention_q8_0(const float *q, float *out, const u64 *k_pages, const u64 *v_pages,
                                          int pos0, int n_head, int n_head_kv, int head_dim, float scale, int window,
                                          float softcap, const float *sinks) {
    attention<true>(q, out, k_pages, v_pages, pos0, n_head, n_head_kv, head_dim, scale, window, softcap, sinks);
}
