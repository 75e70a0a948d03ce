//! The real-I/O runtime of the group cores, over TCP with tokio.
//!
//! * [`host`]: the **group host** ([`serve_host`], [`start_host`]): one process per host that
//!   serves group operations on the registered regions of every tenant (HyperLoop's NIC), and
//!   in [`HostMode::Naive`] the **Naïve baseline**, a replica per tenant replica.
//! * [`client`]: the tenant's client library ([`GroupClient`], [`BlockingGroupClient`]).
//! * [`wire`]: handshake and control messages next to the `GroupMessage` batches.
//! * [`child`]: hosts and replicas as child processes ([`child_main`], [`spawn_child`]).

pub mod child;
pub mod client;
pub mod host;
pub mod hosted;
pub mod wire;

pub use child::{child_main, spawn_child, ChildProcess};
pub use client::{BlockingGroupClient, GroupClient, GroupSpec, KernelEndpoint, WireFaults};
pub use host::{
    serve_host, start_host, Datapath, HostConfig, HostHandle, HostMode, HostSync, TenantCredential,
    TenantQuotas,
};
pub use hosted::{kernel_region, HostLink, HostedInit, KernelRegionSlot, MemberDatagrams, Wake};
pub use wire::{format_token, parse_token};
