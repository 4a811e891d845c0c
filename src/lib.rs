//! Strata: run large language models locally. The engine library behind the `strata` binary.
//!
//! Module map (see docs/ARCHITECTURE.md): `gguf` reads model files, `quant` holds the block formats and
//! their arithmetic, `tokenizer` turns text into tokens and back (and renders chat templates), `model`
//! holds the architecture and the forward pass, `sample` picks tokens, `grammar` keeps them inside a JSON schema or grammar, `engine` runs requests, `hub` finds and downloads models.

pub mod cache;
pub mod device;
pub mod engine;
pub mod gguf;
pub mod grammar;
pub mod hub;
pub mod model;
pub mod plan;
pub mod quant;
pub mod sample;
pub mod server;
pub mod split;
pub mod sync;
pub mod telemetry;
pub mod threadpool;
pub mod tokenizer;
pub mod tools;
