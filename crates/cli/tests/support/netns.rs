//! A private network of Linux network namespaces for process-level fault injection: one
//! namespace per node, all joined by a bridge in a "switch" namespace, plus a veth into the
//! test's own namespace so clients can reach every node. Faults are nftables rules inside a
//! node's namespace (drops from chosen peers, random loss) and signals to node processes.
//! Everything is created under names unique to this process and torn down on drop.
//!
//! Needs root, `ip` (iproute2) and `nft` (nftables); [`Lab::unavailable_reason`] says which is
//! missing so a test can skip with a clear message.

use std::net::Ipv4Addr;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU8, Ordering};

pub struct Lab {
    prefix: String,
    subnet: u8,
    nodes: usize,
}

fn run(program: &str, args: &[&str]) -> Output {
    let output = Command::new(program).args(args).output().unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        output.status.success(),
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

impl Lab {
    /// Why this machine cannot host a lab, or `None` if it can.
    pub fn unavailable_reason() -> Option<String> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Some("not running as root (network namespaces need CAP_NET_ADMIN)".into());
        }
        for (tool, package) in [("ip", "iproute2"), ("nft", "nftables")] {
            let found = Command::new(tool).arg("-V").output().is_ok_and(|out| out.status.success());
            if !found {
                return Some(format!(
                    "`{tool}` not found (install {package}; scripts/test.sh does so as root)"
                ));
            }
        }
        None
    }

    pub fn create(nodes: usize) -> Lab {
        static NEXT_SUBNET: AtomicU8 = AtomicU8::new(0);
        let subnet = 100 + NEXT_SUBNET.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("ch{}s{subnet}", std::process::id() % 100_000);
        let lab = Lab { prefix, subnet, nodes };
        lab.build();
        lab
    }

    fn switch(&self) -> String {
        format!("{}sw", self.prefix)
    }

    pub fn namespace(&self, node: usize) -> String {
        format!("{}n{node}", self.prefix)
    }

    /// Node addresses live in this lab's own namespaces only.
    pub fn node_ip(&self, node: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 77, self.subnet, node as u8 + 1)
    }

    fn host_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 77, self.subnet, 254)
    }

    fn build(&self) {
        let switch = self.switch();
        run("ip", &["netns", "add", &switch]);
        run("ip", &["-n", &switch, "link", "add", "br0", "type", "bridge"]);
        run("ip", &["-n", &switch, "link", "set", "br0", "up"]);
        run("ip", &["-n", &switch, "link", "set", "lo", "up"]);
        for node in 0..self.nodes {
            let namespace = self.namespace(node);
            let (inside, outside) = (format!("{}e{node}", self.prefix), format!("{}p{node}", self.prefix));
            run("ip", &["netns", "add", &namespace]);
            run(
                "ip",
                &[
                    "link", "add", &inside, "netns", &namespace, "type", "veth", "peer", "name", &outside,
                    "netns", &switch,
                ],
            );
            run("ip", &["-n", &switch, "link", "set", &outside, "master", "br0", "up"]);
            let address = format!("{}/24", self.node_ip(node));
            run("ip", &["-n", &namespace, "addr", "add", &address, "dev", &inside]);
            run("ip", &["-n", &namespace, "link", "set", &inside, "up"]);
            run("ip", &["-n", &namespace, "link", "set", "lo", "up"]);
            self.nft(node, "add table inet chorus");
            self.nft(
                node,
                "add chain inet chorus input { type filter hook input priority 0; policy accept; }",
            );
        }
        let (host, outside) = (format!("{}h", self.prefix), format!("{}ph", self.prefix));
        run("ip", &["link", "add", &host, "type", "veth", "peer", "name", &outside, "netns", &switch]);
        run("ip", &["-n", &switch, "link", "set", &outside, "master", "br0", "up"]);
        run("ip", &["addr", "add", &format!("{}/24", self.host_ip()), "dev", &host]);
        run("ip", &["link", "set", &host, "up"]);
    }

    fn nft(&self, node: usize, rule: &str) {
        let namespace = self.namespace(node);
        let mut args = vec!["netns", "exec", &namespace, "nft"];
        args.extend(rule.split(' '));
        run("ip", &args);
    }

    /// Drop every packet `to` receives from `from` (a one-way partition; call twice for a
    /// symmetric one).
    pub fn cut(&self, from: usize, to: usize) {
        self.nft(to, &format!("add rule inet chorus input ip saddr {} drop", self.node_ip(from)));
    }

    /// Drop `percent`% of the packets `node` receives from its peers, at random.
    pub fn lose(&self, node: usize, percent: u8) {
        for peer in (0..self.nodes).filter(|peer| *peer != node) {
            let rule = format!(
                "add rule inet chorus input ip saddr {} numgen random mod 100 < {percent} drop",
                self.node_ip(peer)
            );
            self.nft(node, &rule);
        }
    }

    /// Remove every fault rule: the network heals.
    pub fn heal(&self) {
        for node in 0..self.nodes {
            self.nft(node, "flush chain inet chorus input");
        }
    }

    /// A command that runs `program` inside the node's namespace.
    pub fn command_in(&self, node: usize, program: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.namespace(node), program]);
        command
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veths in it, and with them their peers.
        for node in 0..self.nodes {
            let _ = Command::new("ip").args(["netns", "del", &self.namespace(node)]).output();
        }
        let _ = Command::new("ip").args(["netns", "del", &self.switch()]).output();
        let _ = Command::new("ip").args(["link", "del", &format!("{}h", self.prefix)]).output();
    }
}
