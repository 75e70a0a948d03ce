//! The host's side of the kernel data path: load the XDP program, attach it to every
//! interface of this network namespace, map the regions, and install or remove one member
//! per group (`Initialize` stays in user space). Everything the packet path does afterwards
//! happens without this process.

use std::collections::HashMap;
use std::net::SocketAddrV4;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::{Mutex, PoisonError};

use aya::maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray};
use aya::programs::{Xdp, XdpFlags};
use aya::{Ebpf, EbpfLoader};
use chorus_region::TenantId;

use super::layout::{
    Config, GroupKey, GroupState, Remembered, CHAIN_MAX, REGION_BYTES_MAX, RING, SLOTS_DEFAULT, SLOT_BYTES,
    STAT_NAMES,
};
use crate::op::{GroupId, Token};

mod compiled {
    include!(concat!(env!("OUT_DIR"), "/bpf_object.rs"));
}

/// The compiled program, or why there is none (see build.rs).
pub fn object() -> Result<&'static [u8], &'static str> {
    compiled::OBJECT
}

/// Why this process cannot run the kernel data path, or `None` if it can try.
pub fn unavailable_reason() -> Option<String> {
    if let Err(reason) = object() {
        return Some(format!("not built: {reason}"));
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not running as root (loading XDP programs needs CAP_BPF and CAP_NET_ADMIN)".into());
    }
    None
}

/// What one member of one group needs in the kernel.
#[derive(Clone, Copy, Debug)]
pub struct MemberInstall {
    pub tenant: TenantId,
    pub group: GroupId,
    pub epoch: u64,
    pub token: Token,
    pub start_seq: u64,
    pub slot: u32,
    pub region_bytes: u64,
    pub position: usize,
    pub chain_len: usize,
    /// This member's own address toward `to` (the source of what it sends).
    pub from: SocketAddrV4,
    /// The next member, or at the tail the caller.
    pub to: SocketAddrV4,
}

struct Maps {
    groups: BpfHashMap<MapData, GroupKey, GroupState>,
    config: Array<MapData, Config>,
    stats: PerCpuArray<MapData, u64>,
    /// Region slots by (tenant, region name).
    slots: HashMap<(TenantId, String), (u32, u64)>,
    free: Vec<u32>,
}

/// The regions map, mapped into this process (shared with the kernel).
struct Regions {
    _map: MapData,
    base: *mut u8,
    bytes: usize,
}

// SAFETY: the mapping is shared memory owned by this struct; concurrent readers and the
// kernel's writers race only as a tenant's read-only mapping of a region file would.
unsafe impl Send for Regions {}
// SAFETY: as above; every access goes through bounds-checked copies.
unsafe impl Sync for Regions {}

impl Drop for Regions {
    fn drop(&mut self) {
        // SAFETY: base/bytes are exactly what mmap returned.
        unsafe { libc::munmap(self.base.cast(), self.bytes) };
    }
}

pub struct KernelDatapath {
    // Field order: maps and regions close before the programs' links.
    maps: Mutex<Maps>,
    regions: Regions,
    interfaces: Vec<String>,
    _ebpf: Ebpf,
}

impl KernelDatapath {
    /// Load and attach to `interfaces` (empty: every interface here but `lo`), serving UDP
    /// `port`, with `slots` regions of up to [`REGION_BYTES_MAX`] (0: the default). With
    /// `caller_rps_cpus`, the interface facing the callers steers arrivals to those CPUs
    /// ([`HostConfig::kernel_caller_rps_cpus`](crate::runtime::HostConfig)).
    pub fn start(
        port: u16,
        interfaces: &[String],
        slots: u32,
        caller_rps_cpus: Option<&str>,
    ) -> Result<KernelDatapath, String> {
        if let Some(reason) = unavailable_reason() {
            return Err(reason);
        }
        let object = object().map_err(str::to_string)?;
        let slots = if slots == 0 { SLOTS_DEFAULT } else { slots };
        let mut ebpf = EbpfLoader::new()
            .set_max_entries("ck_regions", slots)
            .load(object)
            .map_err(|e| format!("loading the XDP program: {e:?}"))?;
        let interfaces = if interfaces.is_empty() { local_interfaces()? } else { interfaces.to_vec() };
        if interfaces.is_empty() {
            return Err("no network interface but lo in this namespace to attach to".into());
        }
        let program: &mut Xdp = ebpf
            .program_mut("ck_group_xdp")
            .ok_or("the object has no ck_group_xdp program")?
            .try_into()
            .map_err(|e| format!("ck_group_xdp: {e}"))?;
        program.load().map_err(|e| format!("the verifier refused ck_group_xdp: {e:?}"))?;
        for interface in &interfaces {
            if let Some(mask) = caller_rps_cpus.filter(|_| interface == CALLER_INTERFACE) {
                steer_arrivals(interface, mask)?;
                program
                    .attach(interface, XdpFlags::SKB_MODE)
                    .map_err(|e| format!("attaching XDP (generic) to {interface}: {e}"))?;
                continue;
            }
            program
                .attach(interface, XdpFlags::DRV_MODE)
                .map_err(|e| format!("attaching XDP (native) to {interface}: {e}"))?;
        }
        let take = |ebpf: &mut Ebpf, name: &str| ebpf.take_map(name).ok_or(format!("map {name} missing"));
        let mut config: Array<MapData, Config> =
            take(&mut ebpf, "ck_config")?.try_into().map_err(|e| format!("ck_config: {e}"))?;
        config
            .set(0, Config { port: port.to_be(), reserved: 0, loss_per_million: 0 }, 0)
            .map_err(|e| format!("ck_config: {e}"))?;
        let groups = take(&mut ebpf, "ck_groups")?.try_into().map_err(|e| format!("ck_groups: {e}"))?;
        let stats = take(&mut ebpf, "ck_stats")?.try_into().map_err(|e| format!("ck_stats: {e}"))?;
        let regions = map_regions(take(&mut ebpf, "ck_regions")?, slots)?;
        Ok(KernelDatapath {
            maps: Mutex::new(Maps {
                groups,
                config,
                stats,
                slots: HashMap::new(),
                free: (0..slots).rev().collect(),
            }),
            regions,
            interfaces,
            _ebpf: ebpf,
        })
    }

    pub fn interfaces(&self) -> &[String] {
        &self.interfaces
    }

    /// The regions map's id: another process of this machine (as root) maps a slot of it
    /// with [`open_slot`].
    pub fn regions_map_id(&self) -> Result<u32, String> {
        self.regions._map.info().map(|info| info.id()).map_err(|e| format!("ck_regions: {e}"))
    }

    fn maps(&self) -> std::sync::MutexGuard<'_, Maps> {
        self.maps.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Can a group with these parameters live in the kernel? (Otherwise it is served by the
    /// user-space path.)
    pub fn fits(region_bytes: u64, chain_len: usize) -> Result<(), String> {
        if region_bytes > REGION_BYTES_MAX {
            return Err(format!(
                "a {region_bytes}-byte region exceeds the kernel path's {REGION_BYTES_MAX}-byte slots"
            ));
        }
        if chain_len > CHAIN_MAX {
            return Err(format!("a chain of {chain_len} exceeds the kernel path's {CHAIN_MAX} members"));
        }
        Ok(())
    }

    /// Register (or find again) the tenant's region `name`: a slot of the regions map, kept
    /// with its contents for as long as this process runs.
    pub fn register_region(&self, tenant: TenantId, name: &str, region_bytes: u64) -> Result<u32, String> {
        Self::fits(region_bytes, 1)?;
        let mut maps = self.maps();
        if let Some((slot, bytes)) = maps.slots.get(&(tenant, name.to_string())) {
            if *bytes != region_bytes {
                return Err(format!("region {name:?} of {tenant} has {bytes} bytes, not {region_bytes}"));
            }
            return Ok(*slot);
        }
        let slot = maps.free.pop().ok_or("every kernel region slot is taken")?;
        maps.slots.insert((tenant, name.to_string()), (slot, region_bytes));
        Ok(slot)
    }

    /// Install one member (replacing an earlier one of the same group).
    pub fn install(&self, member: &MemberInstall) -> Result<(), String> {
        Self::fits(member.region_bytes, member.chain_len)?;
        if member.position >= member.chain_len || member.start_seq == 0 {
            return Err(format!(
                "position {} of {} / start {}",
                member.position, member.chain_len, member.start_seq
            ));
        }
        let key = GroupKey { tenant: member.tenant.0, reserved: 0, group: member.group.0 };
        let state = GroupState {
            next_seq: member.start_seq,
            epoch: member.epoch,
            token: member.token.0,
            slot: member.slot,
            region_bytes: member.region_bytes as u32,
            position: member.position as u32,
            chain_len: member.chain_len as u32,
            next_ip: u32::from(*member.to.ip()).to_be(),
            src_ip: u32::from(*member.from.ip()).to_be(),
            next_port: member.to.port().to_be(),
            src_port: member.from.port().to_be(),
            reserved: 0,
            // No sequence number is ever u64::MAX, so nothing is remembered yet.
            ring: [Remembered { seq: u64::MAX, value: 0, present: 0 }; RING],
        };
        self.maps().groups.insert(key, state, 0).map_err(|e| format!("installing the member: {e}"))
    }

    pub fn remove(&self, tenant: TenantId, group: GroupId) {
        let key = GroupKey { tenant: tenant.0, reserved: 0, group: group.0 };
        let _ = self.maps().groups.remove(&key);
    }

    /// The next sequence number the member of this group expects (for tests and recovery).
    pub fn next_seq(&self, tenant: TenantId, group: GroupId) -> Option<u64> {
        let key = GroupKey { tenant: tenant.0, reserved: 0, group: group.0 };
        self.maps().groups.get(&key, 0).ok().map(|state| state.next_seq)
    }

    /// Copy bytes out of a region slot (a one-sided read).
    pub fn read(&self, slot: u32, offset: u64, len: u64) -> Result<Vec<u8>, String> {
        let region = self.region(slot)?;
        let end = offset.checked_add(len).filter(|end| *end <= REGION_BYTES_MAX);
        let end = end.ok_or_else(|| format!("read of {len} bytes at {offset} is outside the region"))?;
        Ok(region[offset as usize..end as usize].to_vec())
    }

    /// The whole slot as this process sees it (the kernel writes it concurrently).
    fn region(&self, slot: u32) -> Result<&[u8], String> {
        let start = slot as u64 * SLOT_BYTES;
        if start + SLOT_BYTES > self.regions.bytes as u64 {
            return Err(format!("no region slot {slot}"));
        }
        // SAFETY: in bounds of the live mapping; the bytes may change under us (the packet
        // path writes them), which a u8 slice tolerates as a region file's mapping does.
        Ok(unsafe {
            std::slice::from_raw_parts(self.regions.base.add(start as usize), REGION_BYTES_MAX as usize)
        })
    }

    /// Zero a region (a fresh registration in tests).
    pub fn clear(&self, slot: u32) -> Result<(), String> {
        let start = slot as u64 * SLOT_BYTES;
        if start + SLOT_BYTES > self.regions.bytes as u64 {
            return Err(format!("no region slot {slot}"));
        }
        // SAFETY: in bounds of the live, writable mapping.
        unsafe { std::ptr::write_bytes(self.regions.base.add(start as usize), 0, SLOT_BYTES as usize) };
        Ok(())
    }

    /// Drop this share of the datagrams arriving here (tests: loss on the wire).
    pub fn set_loss_per_million(&self, loss_per_million: u32) -> Result<(), String> {
        let mut maps = self.maps();
        let config = maps.config.get(&0, 0).map_err(|e| e.to_string())?;
        maps.config.set(0, Config { loss_per_million, ..config }, 0).map_err(|e| e.to_string())
    }

    /// The program's counters, summed over CPUs.
    pub fn stats(&self) -> Vec<(&'static str, u64)> {
        let maps = self.maps();
        STAT_NAMES
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let total = maps.stats.get(&(i as u32), 0).map(|values| values.iter().sum()).unwrap_or(0);
                (*name, total)
            })
            .collect()
    }
}

/// Map `bytes` of region slot `slot` of the regions map `map_id` (a group host's
/// [`KernelDatapath::regions_map_id`]) into this process: the memory the host's XDP program
/// applies operations to, seen as a region (no flush backend: it is kernel memory, no file).
/// The chain store's node reads its member's region this way (docs/protocols/chain.md, "On the
/// kernel path"); its read lock's CAS and the program's gCAS are atomic on the same word.
/// Needs root (CAP_SYS_ADMIN, to open a map by id).
pub fn open_slot(
    tenant: TenantId,
    name: &str,
    map_id: u32,
    slot: u32,
    bytes: u64,
) -> Result<chorus_region::Region, String> {
    if bytes == 0 || bytes > REGION_BYTES_MAX {
        return Err(format!("a {bytes}-byte region does not fit a kernel region slot"));
    }
    let map = MapData::from_id(map_id).map_err(|e| format!("opening BPF map {map_id}: {e}"))?;
    let info = map.info().map_err(|e| format!("BPF map {map_id}: {e}"))?;
    if info.value_size() as u64 != SLOT_BYTES || slot >= info.max_entries() {
        return Err(format!("BPF map {map_id} is not a regions map with a slot {slot}"));
    }
    let offset = u64::from(slot) * SLOT_BYTES;
    chorus_region::Region::map_shared(tenant, name, map.fd().as_fd(), offset, bytes)
        .map_err(|e| e.to_string())
}

/// The interface that faces the callers in a `netlab` namespace.
const CALLER_INTERFACE: &str = "ckr";

/// The interface facing the callers takes the program in generic (skb) mode, without NAPI, so
/// a caller's datagram goes through `netif_rx`, and Receive Packet Steering queues it to a CPU
/// of `mask` (hexadecimal), whose NET_RX softirq (raised by an IPI, preempting whatever task
/// runs there) runs the program and every later hop, instead of the caller's own `sendto`.
fn steer_arrivals(interface: &str, mask: &str) -> Result<(), String> {
    if mask.is_empty() || !mask.chars().all(|c| c.is_ascii_hexdigit() || c == ',') {
        return Err(format!("RPS CPU mask {mask:?}: expected hexadecimal digits, e.g. 2 for CPU 1"));
    }
    let path = format!("/sys/class/net/{interface}/queues/rx-0/rps_cpus");
    std::fs::write(&path, mask).map_err(|e| format!("writing {mask:?} to {path}: {e}"))
}

fn map_regions(map: aya::maps::Map, slots: u32) -> Result<Regions, String> {
    let aya::maps::Map::Array(data) = map else { return Err("ck_regions is not an array".into()) };
    let bytes = slots as usize * SLOT_BYTES as usize;
    let fd = data.fd().as_fd().as_raw_fd();
    // SAFETY: mapping a BPF_F_MMAPABLE array map's whole data area, shared, as the kernel
    // documents; the result is checked and unmapped in Drop.
    let base = unsafe {
        libc::mmap(std::ptr::null_mut(), bytes, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
    };
    if base == libc::MAP_FAILED {
        return Err(format!("mapping the regions map: {}", std::io::Error::last_os_error()));
    }
    Ok(Regions { _map: data, base: base.cast(), bytes })
}

/// Every interface of this network namespace but loopback.
fn local_interfaces() -> Result<Vec<String>, String> {
    let mut names = Vec::new();
    // SAFETY: if_nameindex returns a list terminated by a zero entry, freed below.
    unsafe {
        let list = libc::if_nameindex();
        if list.is_null() {
            return Err(format!("listing interfaces: {}", std::io::Error::last_os_error()));
        }
        let mut entry = list;
        while (*entry).if_index != 0 {
            let name = std::ffi::CStr::from_ptr((*entry).if_name).to_string_lossy().into_owned();
            if name != "lo" {
                names.push(name);
            }
            entry = entry.add(1);
        }
        libc::if_freenameindex(list);
    }
    Ok(names)
}
