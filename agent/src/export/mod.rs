//! Export: the HTTP endpoints (`/metrics` from `telemetry`), the report API, the deploy
//! page and `drainwatch report`.

pub mod api;
pub mod http;
pub mod page;
pub mod report;
pub mod verdict;
