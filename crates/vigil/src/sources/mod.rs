//! Sources: what vigil reads about a server, turned into facts for the core: its log (followed files,
//! pipes), HTTP probes (plain and TLS), the generation proof's request, the process tree (/proc), GPU
//! memory and health (NVML, nvidia-smi), the server's own metrics, GGUF and safetensors model headers, and past startups
//! (the history store).

pub mod engine_metrics;
pub mod follow;
pub mod gguf;
pub mod gpu;
pub mod gpu_health;
pub mod history;
pub mod lines;
pub mod oom;
pub mod probe;
pub mod procs;
pub mod proof;
pub mod safetensors;
pub mod tls;
pub mod tree;
