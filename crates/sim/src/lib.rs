//! The deterministic simulator and the linearizability checker.
//!
//! * [`simulator`]: runs any [`chorus_core::Replica`] core under virtual time with swarm
//!   faults ([`faults`]) and simulated clients ([`workload`]), recording a [`history`].
//! * [`checker`]: Wing-Gong-Lowe linearizability search, per key, for a register with the
//!   RMWs of [`chorus_core::RmwOp`].
//! * [`managed`]: protocols paired with the real membership service (leases, removals of
//!   live nodes, rejoins, restarts), as the main swarms run them.
//! * [`model`]: the performance model, the same cores with CPU and network costs (`chorus model`).
//! * [`shards`]: the migration swarm: replica groups behind one slot map, slots moving
//!   between them while clients run.
//! * [`runner`]: seed sweeps and verdicts, used by `chorus sim` and the tests.
//! * `broken` (feature `broken-variants`): every protocol's deliberately broken variants,
//!   by name, which the checker must catch.

#[cfg(feature = "broken-variants")]
pub mod broken;
pub mod checker;
pub mod faults;
pub mod history;
pub mod managed;
pub mod model;
pub mod rng;
pub mod runner;
pub mod shards;
pub mod simulator;
pub mod workload;
