//! Export: Prometheus metrics and the HTTP endpoints that serve them.

pub mod api;
pub mod http;
pub mod metrics;
pub mod report;
