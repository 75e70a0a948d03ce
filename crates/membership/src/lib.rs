//! Reliable membership (Hermes §2.4, §3.4): views (epoch + live set) agreed by a majority
//! through Raft, heartbeats for failure detection, and leases.
//!
//! # Leases and removal, and why they are safe
//!
//! Every node sends numbered heartbeats to every member. A member `M` that receives heartbeat
//! `s` from `X` at its local time `r` *promises* not to install a view without `X` before
//! `r + lease + drift_margin` (on `M`'s clock), and acknowledges `s`, but only while `X` is
//! live in the newest view `M` has decided. `X`'s lease runs until `t + lease` (on `X`'s
//! clock, `t` = when it sent `s`) once *every other member of `X`'s installed view*
//! acknowledged `s`. Since `r` comes after `t` and clocks run at nearly the same rate (the
//! margin covers the drift), each acknowledging member's promise outlives `X`'s lease.
//!
//! Removing `X` is a Raft entry. The leader proposes it only when `X` missed
//! `missed_heartbeats_max` heartbeat periods and its own promise to `X` has expired. Each
//! member *installs* an applied view that drops `X` only once its own promise to `X` has
//! expired. Views only shrink, so every member of the new view was in `X`'s view and, if `X`
//! holds a lease, promised it. A write in the new epoch needs an ACK from every member of
//! the new view, so it completes only after `X`'s lease has expired, and a lease-respecting
//! `X` has stopped serving by then. This holds under one-way partitions too: what counts is
//! which heartbeats `X` got acknowledged, not what `X` hears. (A majority-based lease does
//! not work: the majority can be `X` plus members already removed, and those gate nothing.)
//!
//! The price is that while a member is dead but not yet removed, nobody holds a lease, so
//! reads pause as well as writes, for at most the failover bound.
//!
//! The core is sans-I/O like the protocols: ticks and messages in, messages and events out.

mod log;
mod managed;
mod message;
pub mod metadata;
mod node;
mod raft_io;
pub mod routing;

pub use log::{LogError, MembershipLog, MEMBERSHIP_LOG};
pub use managed::{Wire, WithMembership};
pub use message::{decode_records, encode_records, MembershipMessage, PERSIST_FRAME_KIND};
pub use metadata::{
    ChangeRefused, Metadata, MetadataOutbox, MovePhase, SlotChange, SlotMove, SlotTable, METADATA_LOG,
};
pub use node::{
    Membership, MembershipConfig, MembershipEvent, MembershipOutbox, MembershipStats, PersistRecord,
};
