//! Export: Prometheus metrics and the HTTP endpoints that serve them.

pub mod http;
pub mod metrics;
