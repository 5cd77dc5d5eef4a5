//! Enrich: who owns each event. Containers are found from cgroups (`cgroup_path`), named from
//! their runtime's state (`runtime_meta`) or the Kubernetes API (`kube`), observed through procfs (`host`), and events are
//! attributed to them (`attribute`).

pub mod attribute;
pub mod cgroup_path;
pub mod host;
pub mod kube;
pub mod nat;
pub mod netstat;
pub mod runtime_meta;

pub use attribute::Enricher;

#[cfg(test)]
mod attribute_tests;
#[cfg(test)]
mod kube_tests;
