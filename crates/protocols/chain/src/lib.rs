//! A key-value store replicated through the HyperLoop group primitives (Kim et al., SIGCOMM
//! 2018), shaped like the paper's MongoDB case study (§5.2) with its recovery (§5.1).
//!
//! Every replica's node holds one member of a HyperLoop group (`chorus_group::ChainMember`)
//! over its region; the head's node also runs the coordinator (`chorus_group::GroupCaller`).
//! Each batch of client updates becomes one redo record: `Append` (gWRITE+gFLUSH into every
//! log) and `ExecuteAndAdvance` (gMEMCPY+gFLUSH per entry, then the log head) under the group
//! write lock (gCAS). The database in the region is a hash index plus a heap of entries
//! ([`layout`]), so any replica answers a read from its own region: the tail lock-free, the
//! others under a read lock. See docs/protocols/chain.md.

pub mod config;
pub mod durable;
pub mod layout;
pub mod member;
pub mod message;
pub mod mirror;
pub mod replica;
pub mod restore;
#[cfg(feature = "sim")]
pub mod sim;

use std::sync::Arc;

pub use config::{Bug, ChainConfig};
pub use durable::ChainState;
pub use layout::ChainLayout;
pub use member::Member;
pub use message::Message;
pub use replica::{Chain, ChainStats};

/// A change applied to every replica's configuration (e.g. to select a broken variant).
pub type ChainTweak = Arc<dyn Fn(&mut ChainConfig) + Send + Sync>;
