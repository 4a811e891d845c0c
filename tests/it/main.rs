//! The engine's integration tests, one binary with a module per topic (each links the whole crate once,
//! not once per topic). `cargo test --release --test it -- server::` runs one topic. The CUDA checks that
//! scripts/gpu-pack ships to a GPU machine stay binaries of their own (tests/gpu_kernels.rs,
//! tests/gpu_forward.rs), small enough to carry.

#[path = "../common/mod.rs"]
mod common;

mod batch;
mod cache_props;
mod cli;
mod cuda;
mod embed;
mod engine;
mod families;
mod gguf;
mod grammar;
mod hardening;
mod hub;
mod kernels;
mod model;
mod moe;
mod native_api;
mod parallel;
mod plan_draft;
mod quantize;
mod reasoning;
mod reference;
mod replay;
mod server;
mod server_hostile;
mod session;
mod spec;
mod split;
mod split_props;
mod switch;
mod tokenizer;
mod tools;
