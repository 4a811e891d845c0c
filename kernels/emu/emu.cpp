// A CPU emulator of the CUDA execution model, for testing the kernels and the CUDA backend's host code on a
// machine without a GPU. Each CUDA thread of a block is a fiber with its own stack; a block's fibers run on
// the calling OS thread, switching at __syncthreads and warp shuffles (barriers over the block or warp that
// count exited threads as arrived, as the hardware does). Blocks run one after another. A barrier no live
// thread can pass is reported as an error, not a hang.
//
// Entry points (C ABI, used from Rust): strata_emu_launch(name, grid, block, args, err, err_len) with args as
// cuLaunchKernel's kernelParams, and strata_emu_signature(name) giving each parameter's kind.

#include "emu.h"

#include <stdint.h>
#include <stdlib.h>

#include <algorithm>
#include <cstddef>
#include <atomic>
#include <memory>
#include <thread>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#include "../attn.cu"
#include "../elementwise.cu"
#include "../moe.cu"
#include "../norm.cu"
#include "../quant.cu"

namespace emu {

const size_t STACK_BYTES = 64 * 1024;

enum State { RUNNABLE, WAIT_BLOCK, WAIT_WARP, DONE };

struct Fiber {
#if defined(__x86_64__)
    void *sp = nullptr;
#else
    ucontext_t ctx;
#endif
    dim3 tid;
    State state = RUNNABLE;
    unsigned wait_gen = 0;
};

struct Warp {
    unsigned gen = 0;
    int arrived = 0, live = 0;
    float slots[2][32];
};

struct Launch {
    dim3 grid, block, bid;
    void (*call)(void **args) = nullptr;
    void **args = nullptr;
    std::vector<Fiber> fibers;
    std::vector<Warp> warps;
    char *stacks = nullptr;
    unsigned block_gen = 0;
    int block_arrived = 0, live = 0;
    Fiber *cur = nullptr;
#if defined(__x86_64__)
    void *sched_sp = nullptr;
#else
    ucontext_t sched;
#endif
};

static thread_local Launch *L = nullptr;

const dim3 &thread_idx() {
    return L->cur->tid;
}
const dim3 &block_idx() {
    return L->bid;
}
const dim3 &block_dim() {
    return L->block;
}
const dim3 &grid_dim() {
    return L->grid;
}

#if defined(__x86_64__)
// switch_stack(save, to): saves the callee-saved registers on the current stack, stores its pointer in
// *save, and resumes the stack `to` (saved the same way, or prepared by `prepare`).
extern "C" void strata_emu_switch(void **save, void *to);
asm(R"(
.text
.globl strata_emu_switch
.type strata_emu_switch,@function
strata_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size strata_emu_switch,.-strata_emu_switch
)");
#endif

static void to_scheduler() {
#if defined(__x86_64__)
    strata_emu_switch(&L->cur->sp, L->sched_sp);
#else
    swapcontext(&L->cur->ctx, &L->sched);
#endif
}

// A thread left: barriers it was counted in may now be complete.
static void release_if_complete(Warp &w) {
    if (w.arrived > 0 && w.arrived == w.live) {
        w.gen++;
        w.arrived = 0;
    }
}

static void fiber_main() {
    Launch *l = L;
    l->call(l->args);
    Fiber *me = l->cur;
    me->state = DONE;
    l->live--;
    if (l->block_arrived > 0 && l->block_arrived == l->live) {
        l->block_gen++;
        l->block_arrived = 0;
    }
    Warp &w = l->warps[me->tid.x / 32];
    w.live--;
    release_if_complete(w);
    to_scheduler();
    abort(); // a finished fiber is never resumed
}

void sync_block() {
    Launch *l = L;
    unsigned gen = l->block_gen;
    if (++l->block_arrived == l->live) {
        l->block_gen++;
        l->block_arrived = 0;
        return;
    }
    l->cur->state = WAIT_BLOCK;
    l->cur->wait_gen = gen;
    to_scheduler();
}

float shfl_xor(float v, int lane_mask) {
    Launch *l = L;
    Fiber *me = l->cur;
    unsigned lane = me->tid.x % 32;
    Warp &w = l->warps[me->tid.x / 32];
    unsigned gen = w.gen;
    w.slots[gen & 1][lane] = v;
    if (++w.arrived == w.live) {
        w.gen++;
        w.arrived = 0;
    } else {
        me->state = WAIT_WARP;
        me->wait_gen = gen;
        to_scheduler();
    }
    unsigned src = lane ^ (unsigned)lane_mask;
    return w.slots[gen & 1][src];
}

static bool runnable(const Launch &l, const Fiber &f) {
    switch (f.state) {
    case RUNNABLE:
        return true;
    case WAIT_BLOCK:
        return l.block_gen != f.wait_gen;
    case WAIT_WARP:
        return l.warps[f.tid.x / 32].gen != f.wait_gen;
    default:
        return false;
    }
}

// Runs one block to completion; false when its threads wait on a barrier that can never complete.
static bool run_block(Launch &l) {
    size_t n = l.fibers.size();
    l.block_gen = 0;
    l.block_arrived = 0;
    l.live = (int)n;
    for (size_t w = 0; w < l.warps.size(); w++) {
        l.warps[w].gen = 0;
        l.warps[w].arrived = 0;
        l.warps[w].live = (int)std::min<size_t>(32, n - 32 * w);
    }
    for (size_t i = 0; i < n; i++) {
        Fiber &f = l.fibers[i];
        f.state = RUNNABLE;
        f.wait_gen = 0;
        char *stack = l.stacks + i * STACK_BYTES;
#if defined(__x86_64__)
        // The stack as strata_emu_switch leaves it: six registers, then fiber_main as the return address,
        // so that fiber_main starts with the stack aligned as after a call.
        uintptr_t top = ((uintptr_t)(stack + STACK_BYTES)) & ~(uintptr_t)15;
        void **sp = (void **)(top - 64);
        for (int r = 0; r < 6; r++) sp[r] = nullptr;
        sp[6] = (void *)&fiber_main;
        sp[7] = nullptr;
        f.sp = sp;
#else
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = stack;
        f.ctx.uc_stack.ss_size = STACK_BYTES;
        f.ctx.uc_link = nullptr;
        makecontext(&f.ctx, &fiber_main, 0);
#endif
    }
    size_t done = 0;
    while (done < n) {
        bool progressed = false;
        done = 0;
        for (size_t i = 0; i < n; i++) {
            Fiber &f = l.fibers[i];
            if (f.state == DONE) {
                done++;
                continue;
            }
            if (!runnable(l, f)) {
                continue;
            }
            f.state = RUNNABLE;
            l.cur = &f;
#if defined(__x86_64__)
            strata_emu_switch(&l.sched_sp, f.sp);
#else
            swapcontext(&l.sched, &f.ctx);
#endif
            progressed = true;
            if (f.state == DONE) {
                done++;
            }
        }
        if (!progressed && done < n) {
            return false;
        }
    }
    return true;
}

// Calls a kernel with cuLaunchKernel-style arguments: args[i] points at the i-th parameter's value.
template <typename... A, size_t... I> void call_with(void (*f)(A...), void **args, std::index_sequence<I...>) {
    f(*static_cast<std::remove_reference_t<A> *>(args[I])...);
}

template <typename... A> void call(void (*f)(A...), void **args) {
    call_with(f, args, std::index_sequence_for<A...>{});
}

// One letter per parameter: p pointer, i int, l long long, f float, u unsigned.
template <typename T> constexpr char kind() {
    if constexpr (std::is_pointer_v<T>) {
        return 'p';
    } else if constexpr (std::is_same_v<T, int>) {
        return 'i';
    } else if constexpr (std::is_same_v<T, long long>) {
        return 'l';
    } else if constexpr (std::is_same_v<T, float>) {
        return 'f';
    } else if constexpr (std::is_same_v<T, unsigned>) {
        return 'u';
    } else {
        return '?';
    }
}

template <typename... A> std::string signature(void (*)(A...)) {
    return std::string{kind<A>()...};
}

struct Entry {
    const char *name;
    void (*call)(void **);
    std::string (*signature)();
};

#define ENTRY(k)                                                                                                  \
    Entry {                                                                                                        \
        #k, [](void **a) { call(&::k, a); }, []() { return signature(&::k); }                                     \
    }
#define QUANT_ENTRIES(T) ENTRY(matvec_##T), ENTRY(matvec_many_##T), ENTRY(gemm_##T), ENTRY(rows_##T)

static const Entry TABLE[] = {
    ENTRY(rms_norm_f32),    ENTRY(rms_norm_add_f32), ENTRY(add_bias_f32),   ENTRY(swiglu_f32),
    ENTRY(swiglu_oai_f32),  ENTRY(geglu_f32),        ENTRY(scale_f32),      ENTRY(softcap_f32),
    ENTRY(moe_scatter_f32), ENTRY(moe_sum_f32),
    ENTRY(gather_rows_f32), ENTRY(rope_f32),    ENTRY(kv_store_f16),    ENTRY(kv_store_q8_0), ENTRY(kv_gather),
    ENTRY(attention_f16),  ENTRY(attention_q8_0), QUANT_ENTRIES(f32),   QUANT_ENTRIES(f16),
    QUANT_ENTRIES(bf16),   QUANT_ENTRIES(q8_0), QUANT_ENTRIES(q4_0),    QUANT_ENTRIES(q4_1),
    QUANT_ENTRIES(q5_0),   QUANT_ENTRIES(q5_1), QUANT_ENTRIES(q4_K),    QUANT_ENTRIES(q5_K),
    QUANT_ENTRIES(q6_K),   QUANT_ENTRIES(iq4_nl), QUANT_ENTRIES(mxfp4),
};

static const Entry *find(const char *name) {
    for (const Entry &e : TABLE) {
        if (strcmp(e.name, name) == 0) {
            return &e;
        }
    }
    return nullptr;
}

static void put(char *err, size_t len, const std::string &msg) {
    if (len > 0) {
        size_t n = std::min(len - 1, msg.size());
        memcpy(err, msg.data(), n);
        err[n] = 0;
    }
}

// Runs blocks `next++` of the grid until none is left or one fails (then *failed holds its message).
static void run_blocks(const Entry *e, dim3 grid, dim3 block, void **args, std::atomic<size_t> *next,
                       std::atomic<bool> *stop, std::string *failed) {
    size_t threads = block.x;
    Launch l;
    l.grid = grid;
    l.block = block;
    l.call = e->call;
    l.args = args;
    l.fibers.resize(threads);
    for (size_t i = 0; i < threads; i++) l.fibers[i].tid = dim3{(unsigned)i, 0, 0};
    l.warps.resize((threads + 31) / 32);
    // Fiber stacks, kept per OS thread across launches and never cleared (a fiber's frame initializes what
    // it uses).
    static thread_local std::unique_ptr<char[]> stack_pool;
    static thread_local size_t stack_pool_threads = 0;
    if (stack_pool_threads < threads) {
        stack_pool.reset(new char[threads * STACK_BYTES]);
        stack_pool_threads = threads;
    }
    l.stacks = stack_pool.get();
    Launch *outer = L;
    L = &l;
    size_t total = (size_t)grid.x * grid.y * grid.z;
    for (size_t b = (*next)++; b < total && !*stop; b = (*next)++) {
        l.bid = dim3{(unsigned)(b % grid.x), (unsigned)(b / grid.x % grid.y), (unsigned)(b / grid.x / grid.y)};
        if (!run_block(l)) {
            *failed = "threads of block (" + std::to_string(l.bid.x) + ", " + std::to_string(l.bid.y) + ", " +
                      std::to_string(l.bid.z) + ") wait at a barrier no thread can complete";
            *stop = true;
        }
    }
    L = outer;
}

} // namespace emu

// 0 on success; otherwise nonzero with a message in err. Blocks are spread over the machine's cores (each
// OS thread runs whole blocks, as an SM would); a kernel's blocks never share memory but its output.
extern "C" int strata_emu_launch(const char *name, const unsigned grid[3], const unsigned block[3], void **args,
                                 char *err, size_t err_len) {
    using namespace emu;
    const Entry *e = find(name);
    if (!e) {
        put(err, err_len, std::string("no kernel named ") + name);
        return 1;
    }
    size_t threads = (size_t)block[0] * block[1] * block[2];
    if (threads == 0 || threads > 1024 || block[1] != 1 || block[2] != 1) {
        put(err, err_len, std::string(name) + ": the emulator runs 1 to 1024 threads in x only");
        return 2;
    }
    dim3 g{grid[0], grid[1], grid[2]}, b{block[0], 1, 1};
    size_t total = (size_t)grid[0] * grid[1] * grid[2];
    size_t workers = std::min<size_t>(std::max(1u, std::thread::hardware_concurrency()), total);
    std::atomic<size_t> next{0};
    std::atomic<bool> stop{false};
    std::vector<std::string> failed(workers);
    std::vector<std::thread> pool;
    for (size_t w = 1; w < workers; w++) {
        pool.emplace_back(run_blocks, e, g, b, args, &next, &stop, &failed[w]);
    }
    run_blocks(e, g, b, args, &next, &stop, &failed[0]);
    for (std::thread &t : pool) t.join();
    for (const std::string &f : failed) {
        if (!f.empty()) {
            put(err, err_len, std::string(name) + ": " + f);
            return 3;
        }
    }
    return 0;
}

// The parameter kinds of kernel `name` (see emu::kind) into out; 0 when found.
extern "C" int strata_emu_signature(const char *name, char *out, size_t out_len) {
    const emu::Entry *e = emu::find(name);
    if (!e) {
        return 1;
    }
    emu::put(out, out_len, e->signature());
    return 0;
}

// How many kernels the emulator has, and the name of the i-th.
extern "C" size_t strata_emu_kernel_count() {
    return sizeof(emu::TABLE) / sizeof(emu::TABLE[0]);
}

extern "C" const char *strata_emu_kernel_name(size_t i) {
    return i < strata_emu_kernel_count() ? emu::TABLE[i].name : nullptr;
}
