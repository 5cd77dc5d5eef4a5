//! drainwatch: the pipeline is capture (eBPF programs and the ring-buffer reader) → enrich →
//! correlate → export (metrics and HTTP). See ARCHITECTURE.md.

pub mod agent;
pub mod capture;
pub mod cli;
pub mod correlate;
pub mod enrich;
pub mod export;
pub mod model;
pub mod pipeline;
pub mod queue;

#[cfg(test)]
mod layout_tests;
