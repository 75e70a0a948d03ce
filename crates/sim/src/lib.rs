//! The deterministic simulator and the linearizability checker.
//!
//! * [`simulator`]: runs any [`chorus_core::Replica`] core under virtual time with swarm
//!   faults ([`faults`]) and simulated clients ([`workload`]), recording a [`history`].
//! * [`checker`]: Wing-Gong-Lowe linearizability search, per key, for a register with the
//!   RMWs of [`chorus_core::RmwOp`].
//! * [`runner`]: seed sweeps and verdicts, used by `chorus sim` and the tests.

pub mod checker;
pub mod faults;
pub mod history;
pub mod rng;
pub mod runner;
pub mod simulator;
pub mod workload;
