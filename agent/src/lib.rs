//! drainwatch: the pipeline is capture (eBPF programs and the ring-buffer reader) → enrich →
//! correlate → export (HTTP, the report API and page), with telemetry (the agent's metrics) on
//! the ground floor beside model. See ARCHITECTURE.md.

pub mod agent;
pub mod capture;
pub mod checkpoint;
pub mod cli;
pub mod consumer;
pub mod correlate;
pub mod enrich;
pub mod export;
pub mod model;
pub mod pipeline;
pub mod queue;
pub mod telemetry;

#[cfg(test)]
mod layout_tests;
