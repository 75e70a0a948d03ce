//! chorus-bench: load generators (YCSB core workloads A-F, a GET/SET microworkload) for RESP
//! servers and etcd, and `chorus bench compare`, which runs Chorus and its peers side by side.
//!
//! Benchmarks are commands that print and save results; nothing here asserts on timing.

pub mod charts;
pub mod cli;
pub mod client;
pub mod compare;
pub mod driver;
pub mod etcd;
pub mod etcd_tool;
pub mod failover;
pub mod generator;
pub mod group;
pub mod plot;
pub mod procs;
pub mod protocols;
pub mod raftlog;
pub mod report;
pub mod resp;
pub mod tenants;
pub mod workload;
