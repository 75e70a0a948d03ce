//! HyperLoop group primitives (Kim et al., SIGCOMM 2018, §4 and Table 1) for Chorus.
//!
//! A group is a chain of members, each a registered region ([`chorus_region`]) on some node;
//! a caller submits gWRITE, gCAS, gMEMCPY and gFLUSH operations ([`Operation`]) that travel
//! head to tail, are applied in order at every member, and are acknowledged by the tail. On
//! commodity machines the role of HyperLoop's RDMA NIC is played by the host's `chorus node`
//! process: it runs a [`ChainMember`] per group, so the tenant's own process is never on the
//! critical path.
//!
//! * [`op`]: operations, validation, errors, the group configuration.
//! * [`message`]: the wire messages between caller and members.
//! * [`member`]: the member core ([`ChainMember`]).
//! * [`caller`]: the caller core ([`GroupCaller`]): sequencing, pipelining, retransmission.
//! * [`txn`]: the replicated-transaction API of §5 (Append, ExecuteAndAdvance, locks).
//! * [`sim`]: a seeded simulator with network faults and a checker against a reference model.
//! * [`runtime`]: the TCP runtime: the group host (and the Naïve baseline) and the client.
//! * [`kernel`]: the kernel data path: the XDP program that applies and forwards operations
//!   in the packet path, and what the host needs to run it.
//!
//! The benchmarks over these (§6.1, §6.2) live in `chorus-bench` (`group`, `tenants`).
//!
//! Both cores are sans-I/O: messages and ticks in, sends and completions out
//! ([`GroupOutbox`]).

pub mod caller;
pub mod kernel;
pub mod member;
pub mod message;
pub mod op;
pub mod outbox;
pub mod runtime;
pub mod sim;
pub mod txn;

pub use caller::{CallerConfig, CallerStats, GroupCaller};
pub use member::{ChainMember, InitError, MemberStats};
pub use message::GroupMessage;
pub use op::{GroupConfig, GroupError, GroupId, OpError, OpOutcome, Operation, Primitive, Refusal, Token};
pub use outbox::{GroupOutbox, RequestId};
