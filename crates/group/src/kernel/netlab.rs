//! Network namespaces for the kernel data path: one per group host, every pair of hosts and
//! every host and the creating namespace (where callers run) joined by a veth pair, so each
//! hop of a chain is one veth and XDP redirects it directly.
//!
//! Each host has one address (10.78.S.h+1) on all its veths and a /32 route to every other
//! host through the veth that reaches it; the creating namespace has 10.78.S.100 likewise.
//! Names start with `ck` and are unique to the process; everything is removed on drop.
//! Receivers of redirected frames need NAPI on their veth: host-side veths get it from the
//! host's XDP program, caller-side veths from GRO (`ethtool -K ... gro on`).

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

pub struct NetLab {
    prefix: String,
    subnet: u8,
    hosts: usize,
}

fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let output = Command::new(program).args(args).output().map_err(|e| format!("{program}: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(())
}

/// The first subnet from `preferred` on (1 to 250, wrapping) that no lab in this namespace
/// uses: another test process, or one killed before it could clean up, may hold the one its
/// process id picks ("RTNETLINK answers: File exists" otherwise).
fn free_subnet(preferred: u8) -> u8 {
    let addresses = Command::new("ip").args(["-4", "-o", "addr", "show"]).output();
    let in_use = addresses.map(|out| String::from_utf8_lossy(&out.stdout).into_owned()).unwrap_or_default();
    (0..250u16)
        .map(|step| ((u16::from(preferred) - 1 + step) % 250) as u8 + 1)
        .find(|subnet| !in_use.contains(&format!("10.78.{subnet}.100/")))
        .unwrap_or(preferred)
}

impl NetLab {
    /// Why this machine cannot build a lab, or `None`.
    pub fn unavailable_reason() -> Option<String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Some("not running as root (network namespaces need CAP_NET_ADMIN)".into());
        }
        for (tool, version, package) in [("ip", "-V", "iproute2"), ("ethtool", "--version", "ethtool")] {
            if !Command::new(tool).arg(version).output().is_ok_and(|out| out.status.success()) {
                return Some(format!(
                    "`{tool}` not found (install {package}; scripts/test.sh does so as root)"
                ));
            }
        }
        None
    }

    /// `hosts` namespaces in a full mesh with the creating namespace.
    pub fn create(hosts: usize) -> Result<NetLab, String> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        assert!((1..=16).contains(&hosts), "a lab has 1 to 16 hosts");
        let run_id = std::process::id().wrapping_mul(16).wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed));
        let subnet = free_subnet((run_id % 250) as u8 + 1);
        let lab = NetLab { prefix: format!("ck{:05x}", run_id & 0xfffff), subnet, hosts };
        lab.build()?;
        Ok(lab)
    }

    pub fn hosts(&self) -> usize {
        self.hosts
    }

    pub fn namespace(&self, host: usize) -> String {
        format!("{}h{host}", self.prefix)
    }

    /// Host `host`'s address (on every one of its veths).
    pub fn host_ip(&self, host: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 78, self.subnet, host as u8 + 1)
    }

    /// The creating namespace's address, where callers bind.
    pub fn caller_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 78, self.subnet, 100)
    }

    /// The command line that runs `program` inside host `host`'s namespace.
    pub fn command_in(&self, host: usize, program: &[String]) -> Vec<String> {
        let mut command = vec!["ip".to_string(), "netns".into(), "exec".into(), self.namespace(host)];
        command.extend(program.iter().cloned());
        command
    }

    /// Receive Packet Steering at every host's interface facing the callers: their arrivals
    /// are received in the NET_RX softirq of a CPU of `mask` (hexadecimal, e.g. `2` for CPU
    /// 1), raised there by an IPI, instead of in the sender's own `sendto`: where a NIC's
    /// interrupt would run them. A program attached natively (XDP in the veth's NAPI) runs
    /// before this steering; `KernelDatapath` attaches in generic mode there when asked.
    pub fn steer_caller_arrivals(&self, mask: &str) -> Result<(), String> {
        if mask.is_empty() || !mask.chars().all(|c| c.is_ascii_hexdigit() || c == ',') {
            return Err(format!("RPS CPU mask {mask:?}: expected hexadecimal digits, e.g. 2 for CPU 1"));
        }
        for host in 0..self.hosts {
            // `ip netns exec` mounts the namespace's own /sys, where `ckr` is this host's.
            let write = format!("echo {mask} > /sys/class/net/ckr/queues/rx-0/rps_cpus");
            run("ip", &["netns", "exec", &self.namespace(host), "sh", "-c", &write])?;
        }
        Ok(())
    }

    fn build(&self) -> Result<(), String> {
        let caller = format!("{}", self.caller_ip());
        for host in 0..self.hosts {
            let namespace = self.namespace(host);
            run("ip", &["netns", "add", &namespace])?;
            run("ip", &["-n", &namespace, "link", "set", "lo", "up"])?;
            // The XDP program forwards through the kernel's forwarding lookup.
            run("ip", &["netns", "exec", &namespace, "sysctl", "-qw", "net.ipv4.conf.all.forwarding=1"])?;
            // The caller's veth: `<prefix>r<h>` here, `ckr` in the host's namespace.
            let outside = format!("{}r{host}", self.prefix);
            run(
                "ip",
                &["link", "add", &outside, "type", "veth", "peer", "name", "ckr", "netns", &namespace],
            )?;
            let me = format!("{}", self.host_ip(host));
            run("ip", &["addr", "add", &format!("{caller}/32"), "dev", &outside])?;
            run("ip", &["link", "set", &outside, "up"])?;
            run("ip", &["route", "add", &format!("{me}/32"), "dev", &outside, "src", &caller])?;
            run("ethtool", &["-K", &outside, "gro", "on"])?;
            run("ip", &["-n", &namespace, "addr", "add", &format!("{me}/32"), "dev", "ckr"])?;
            run("ip", &["-n", &namespace, "link", "set", "ckr", "up"])?;
            run(
                "ip",
                &["-n", &namespace, "route", "add", &format!("{caller}/32"), "dev", "ckr", "src", &me],
            )?;
        }
        for a in 0..self.hosts {
            for b in a + 1..self.hosts {
                let (ns_a, ns_b) = (self.namespace(a), self.namespace(b));
                let (to_b, to_a) = (format!("ckh{b}"), format!("ckh{a}"));
                run(
                    "ip",
                    &[
                        "-n", &ns_a, "link", "add", &to_b, "type", "veth", "peer", "name", &to_a, "netns",
                        &ns_b,
                    ],
                )?;
                for (namespace, device, me, peer) in [
                    (&ns_a, &to_b, self.host_ip(a), self.host_ip(b)),
                    (&ns_b, &to_a, self.host_ip(b), self.host_ip(a)),
                ] {
                    let (me, peer) = (me.to_string(), peer.to_string());
                    run("ip", &["-n", namespace, "addr", "add", &format!("{me}/32"), "dev", device])?;
                    run("ip", &["-n", namespace, "link", "set", device, "up"])?;
                    run(
                        "ip",
                        &["-n", namespace, "route", "add", &format!("{peer}/32"), "dev", device, "src", &me],
                    )?;
                }
            }
        }
        Ok(())
    }
}

impl Drop for NetLab {
    fn drop(&mut self) {
        // Deleting a namespace deletes its veths and with them their peers.
        for host in 0..self.hosts {
            let _ = Command::new("ip").args(["netns", "del", &self.namespace(host)]).output();
        }
    }
}
