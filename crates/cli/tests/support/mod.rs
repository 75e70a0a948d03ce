//! Helpers shared by the process-level tests.

#![allow(dead_code)] // Each test file uses a different part.

pub mod loopback;
pub mod netns;
pub mod scratch;
pub mod workload;
