//! Scale-out behind the Redis Cluster protocol (docs/resp.md, "Cluster"): the key space is
//! split into 16384 hash slots (`chorus_core::slots`), each owned by one replica group (a
//! cluster of `chorus node`s running any protocol). A node serves the keys of its group's
//! slots and redirects every other key with `-MOVED`, so cluster-aware clients (redis-cli -c,
//! redis-benchmark --cluster, redis-py's RedisCluster...) route by themselves.
//!
//! * [`config`]: the `[cluster]` section of a node's configuration.
//! * [`map`]: the slot map, the routing check every command passes at dispatch.
//! * [`command`]: the CLUSTER command family.
//! * [`service`]: the metadata service that holds the map (Raft over every node of every
//!   group), and what connections see of it.
//! * [`gate`] and [`migrate`]: moving a slot with its keys while clients run (the drain
//!   every node of the old group reports, the movers; docs/decisions.md, decision 16).

pub mod command;
pub mod config;
pub mod gate;
pub mod map;
pub mod migrate;
pub mod service;

pub use config::{ClusterSettings, GroupSettings, RawCluster, RawGroup};
pub use map::SlotMap;
pub use service::Cluster;
