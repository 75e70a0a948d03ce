//! Hermes (Katsarou et al., ASPLOS 2020) as a sans-I/O replica core.
//!
//! Reads complete locally at any replica whose copy of the key is Valid. Writes start at any
//! replica: the coordinator applies the write locally, broadcasts an INV carrying the key,
//! the new logical timestamp and the value, gathers ACKs from every live replica of the
//! current view, and broadcasts a VAL. Invalidated replicas that wait too long replay the
//! write with its original timestamp and value. RMWs conflict and may abort. Every message
//! carries the sender's epoch. See docs/protocols/hermes.md for the section-by-section map.

pub mod config;
pub mod key;
pub mod message;
pub mod replica;

pub use config::{Bug, HermesConfig, Optimizations};
pub use key::KeyState;
pub use message::Message;
pub use replica::{Hermes, HermesStats};
