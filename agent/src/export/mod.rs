//! Export: Prometheus metrics, the HTTP endpoints that serve them, the report API, the deploy
//! page and `drainwatch report`.

pub mod api;
pub mod http;
pub mod metrics;
pub mod page;
pub mod report;
pub mod verdict;
