//! Export: Prometheus metrics, the HTTP endpoints that serve them, the report API (its typed
//! views and how records become them), the verdicts, the deploy page and `drainwatch report`.

pub mod api;
pub mod format;
pub mod http;
pub mod metrics;
pub mod page;
pub mod report;
pub mod verdict;
pub mod view;
