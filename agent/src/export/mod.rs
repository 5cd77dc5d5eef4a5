//! Export: the HTTP endpoints (`/metrics` from `telemetry`), the report API (its typed views
//! and how records become them), the verdicts, the deploy page and `drainwatch report`.

pub mod api;
pub mod auth;
pub mod cluster;
pub mod cluster_kube;
#[cfg(test)]
mod cluster_tests;
mod conns;
pub mod events;
#[cfg(test)]
mod events_tests;
pub mod format;
pub mod gate;
pub mod guard;
pub mod http;
#[cfg(test)]
mod kube_double;
pub mod page;
pub mod report;
pub mod terminal;
pub mod verdict;
pub mod view;

#[cfg(test)]
mod auth_tests;
