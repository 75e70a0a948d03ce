//! Reliable membership (Hermes §2.4, §3.4): views (epoch + live set) agreed by a majority
//! through Raft, heartbeats for failure detection, and leases.
//!
//! # Leases and removal, and why they are safe
//!
//! Every node sends numbered heartbeats to every member. A member `M` that receives heartbeat
//! `s` from `X` at its local time `r` *promises* not to install a view without `X` before
//! `r + lease + drift_margin` (on `M`'s clock), and acknowledges `s`. `X`'s lease runs until
//! `t + lease` (on `X`'s clock, `t` = when it sent `s`) once a majority of members, `X`
//! included, acknowledged `s`. Since `r` comes after `t` and clocks run at nearly the same
//! rate (the margin covers the drift), every acknowledging member's promise outlives `X`'s
//! lease.
//!
//! Removing `X` is a Raft entry. The leader proposes it only when `X` missed
//! `missed_heartbeats_max` heartbeat periods and its own promise to `X` has expired. Each
//! member *installs* an applied view that drops `X` only once its own promise to `X` has
//! expired. A write in the new epoch needs an ACK from every live member of the new view,
//! and at least one of them acknowledged `X`'s last lease-granting heartbeat (the majority
//! that granted it cannot all have been removed). So by the time any write of the new epoch
//! completes, `X`'s lease has expired, and a lease-respecting `X` has stopped serving. This
//! holds under one-way partitions too: what counts is which heartbeats `X` got acknowledged,
//! not what `X` hears.
//!
//! The core is sans-I/O like the protocols: ticks and messages in, messages and events out.

mod managed;
mod message;
mod node;

pub use managed::{Wire, WithMembership};
pub use message::MembershipMessage;
pub use node::{Membership, MembershipConfig, MembershipEvent, MembershipOutbox, PersistRecord};
