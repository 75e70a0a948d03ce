//! `chorus group-host` (a host serving HyperLoop group operations for its tenants' regions)
//! and the hidden `chorus group-child` that hosts and Naïve replicas start as processes.

use std::net::SocketAddr;
use std::path::PathBuf;

use chorus_group::runtime::{HostConfig, HostMode, TenantCredential, TenantQuotas};

#[derive(clap::Args)]
pub struct GroupHostArgs {
    /// Where callers and chain predecessors connect.
    #[arg(long, default_value = "127.0.0.1:7600")]
    listen: SocketAddr,
    /// Directory of the tenants' regions (default /dev/shm/chorus-regions).
    #[arg(long)]
    region_dir: Option<PathBuf>,
    /// A tenant this host serves, as ID:TOKEN (32 hex digits); repeat for each.
    #[arg(long = "tenant", value_name = "ID:TOKEN", required = true)]
    tenants: Vec<String>,
    /// Flush backend: msync (default), clwb (DAX with MAP_SYNC only) or none.
    #[arg(long, default_value = "msync")]
    flush: String,
    /// When the members' gFLUSHes are made durable: always (once per frame received, before
    /// anything it produced is forwarded or acknowledged), everysec or no (as a node's
    /// appendfsync; `chorus up` passes its nodes').
    #[arg(long, default_value = "always")]
    sync: String,
    /// chorus: this process performs every tenant's operations; naive: one replica process
    /// per tenant replica (`chorus naive-replica`, the baseline of HyperLoop §6, Naïve-Event);
    /// naive-polling: the same with busy-polling replicas (Naïve-Polling).
    #[arg(long, default_value = "chorus")]
    mode: String,
    /// kernel: apply and forward operations in the kernel's packet path (XDP, needs root and
    /// a build with clang; falls back to user, saying why); user: in this process.
    #[arg(long, default_value = "user")]
    datapath: String,
    /// Kernel path: attach to this interface (repeat; default every interface but lo).
    #[arg(long = "kernel-interface", value_name = "IFACE")]
    kernel_interfaces: Vec<String>,
    /// Another group host's IP address: members may forward to it (repeat). Loopback
    /// addresses are always allowed; nothing else is unless listed.
    #[arg(long = "peer", value_name = "IP")]
    peers: Vec<std::net::IpAddr>,
    /// Per tenant: regions at most.
    #[arg(long, default_value_t = TenantQuotas::default().regions_max)]
    tenant_regions_max: usize,
    /// Per tenant: total region bytes at most.
    #[arg(long, default_value_t = TenantQuotas::default().region_bytes_max)]
    tenant_region_bytes_max: u64,
    /// Per tenant: Naïve replicas running at once at most.
    #[arg(long, default_value_t = TenantQuotas::default().naive_replicas_max)]
    tenant_naive_replicas_max: usize,
}

pub fn run_host(args: GroupHostArgs) -> anyhow::Result<i32> {
    let mut tenants = Vec::new();
    for tenant in &args.tenants {
        let Some((id, token)) = tenant.split_once(':') else {
            anyhow::bail!("--tenant {tenant:?}: expected ID:TOKEN");
        };
        let tenant = id.parse().map_err(|_| anyhow::anyhow!("--tenant {id:?}: not a tenant id"))?;
        chorus_group::runtime::parse_token(token)
            .map_err(|error| anyhow::anyhow!("--tenant {id}: {error}"))?;
        tenants.push(TenantCredential { tenant, token: token.to_string() });
    }
    let region_dir = args.region_dir.unwrap_or_else(chorus_region::default_region_dir);
    let mut config = HostConfig::new(args.listen, region_dir, tenants);
    config.flush = args.flush.parse().map_err(|error| anyhow::anyhow!("--flush: {error}"))?;
    config.sync = args.sync.parse().map_err(|error| anyhow::anyhow!("--sync: {error}"))?;
    config.mode = args.mode.parse::<HostMode>().map_err(|error| anyhow::anyhow!("--mode: {error}"))?;
    config.datapath = args.datapath.parse().map_err(|error| anyhow::anyhow!("--datapath: {error}"))?;
    config.kernel_interfaces = args.kernel_interfaces;
    config.peers = args.peers;
    config.quotas = TenantQuotas {
        regions_max: args.tenant_regions_max,
        region_bytes_max: args.tenant_region_bytes_max,
        naive_replicas_max: args.tenant_naive_replicas_max,
    };
    if config.mode.is_naive() {
        let exe = std::env::current_exe()?.to_string_lossy().into_owned();
        config.replica_command = Some(vec![exe, "naive-replica".to_string()]);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(chorus_group::runtime::serve_host(config))?;
    Ok(0)
}

/// A group host or Naïve replica started by another chorus process: its configuration (JSON,
/// `chorus_group::runtime::HostConfig`) arrives on stdin; it prints `LISTENING <addr>` and
/// serves until stdin closes (or, as a Naïve replica, until its group's caller leaves).
pub fn run_child() -> anyhow::Result<i32> {
    chorus_group::runtime::child_main()?;
    Ok(0)
}
