//! A private network of Linux network namespaces for process-level fault injection: one
//! namespace per node, all joined by a bridge in a "switch" namespace, plus a veth into the
//! test's own namespace so clients can reach every node. Faults are nftables rules inside a
//! node's namespace (drops from chosen peers, random loss) and signals to node processes.
//! Everything is created under names unique to this process and torn down on drop.
//!
//! Needs root, `ip` (iproute2) and `nft` (nftables); [`Lab::unavailable_reason`] says which is
//! missing so a test can skip with a clear message.

use std::ffi::OsStr;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

/// The ports every node listens on, at its own address in its own namespace.
pub const CLIENT_PORT: u16 = 6379;
pub const PEER_PORT: u16 = 7000;

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

/// The first subnet 10.77.S.0/24 (S from 100 on) with no address in this namespace. A lab
/// whose process was killed before its drop ran keeps its host veth and route; a new lab on
/// the same subnet would send its clients into the dead lab's bridge, and every node would
/// look unreachable ("node 0 never became ready").
fn free_subnet() -> u8 {
    let addresses = run("ip", &["-4", "-o", "addr", "show"]);
    let in_use = String::from_utf8_lossy(&addresses.stdout).into_owned();
    (100..=250u8)
        .find(|subnet| !in_use.contains(&format!(" 10.77.{subnet}.")))
        .expect("a free 10.77.S.0/24 subnet for a test lab (more than 150 labs in use?)")
}

/// Delete the namespaces and host veths of labs (`ch<pid>s<subnet>...`) whose process is gone:
/// they were killed (a CI timeout, a ^C) before their drop could clean up.
fn remove_labs_of_dead_processes() {
    let listing = run("ip", &["netns", "list"]);
    let listing = String::from_utf8_lossy(&listing.stdout).into_owned();
    let mut dead_prefixes: Vec<String> = Vec::new();
    for name in listing.lines().filter_map(|line| line.split_whitespace().next()) {
        let Some((pid, subnet_and_rest)) = name.strip_prefix("ch").and_then(|rest| rest.split_once('s'))
        else {
            continue;
        };
        let subnet: String = subnet_and_rest.chars().take_while(char::is_ascii_digit).collect();
        let (Ok(pid), false) = (pid.parse::<u32>(), subnet.is_empty()) else { continue };
        // The prefix holds the pid modulo 100,000: a live process with that remainder may own it.
        let owner_may_live = std::fs::read_dir("/proc").is_ok_and(|entries| {
            entries.filter_map(Result::ok).any(|entry| {
                entry
                    .file_name()
                    .to_str()
                    .and_then(|n| n.parse::<u32>().ok())
                    .is_some_and(|live| live % 100_000 == pid)
            })
        });
        if !owner_may_live {
            let _ = Command::new("ip").args(["netns", "del", name]).output();
            let prefix = format!("ch{pid}s{subnet}");
            if !dead_prefixes.contains(&prefix) {
                dead_prefixes.push(prefix);
            }
        }
    }
    for prefix in dead_prefixes {
        eprintln!("removed the network-namespace lab {prefix} of a process that no longer runs");
        let _ = Command::new("ip").args(["link", "del", &format!("{prefix}h")]).output();
    }
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
        static CREATING: Mutex<()> = Mutex::new(());
        let _one_at_a_time = CREATING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        remove_labs_of_dead_processes();
        let subnet = free_subnet();
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

    /// Node `node`'s client address (`ip:port`).
    pub fn client_addr(&self, node: usize) -> String {
        format!("{}:{CLIENT_PORT}", self.node_ip(node))
    }

    /// Node `node`'s peer address (`ip:port`), e.g. a donor for `--join`.
    pub fn peer_addr(&self, node: usize) -> String {
        format!("{}:{PEER_PORT}", self.node_ip(node))
    }

    /// A client connection to node `node` whose replies may take up to `read_timeout`.
    pub fn connect(&self, node: usize, read_timeout: Duration) -> redis::RedisResult<redis::Connection> {
        let url = format!("redis://{}/", self.client_addr(node));
        let con = redis::Client::open(url)?.get_connection_with_timeout(Duration::from_secs(5))?;
        con.set_read_timeout(Some(read_timeout))?;
        Ok(con)
    }

    /// Node `node`'s membership view epoch (`chorus_view_epoch` in `INFO replication`).
    pub fn view_epoch(&self, node: usize) -> u64 {
        let mut con = self.connect(node, Duration::from_secs(30)).unwrap();
        let info: String = redis::cmd("INFO").arg("replication").query(&mut con).unwrap();
        let line = info.lines().find(|line| line.starts_with("chorus_view_epoch:")).expect("epoch in INFO");
        line["chorus_view_epoch:".len()..].trim().parse().unwrap()
    }

    /// Wait until each node of `which` has its `peers` peer links up and is operational (it
    /// holds a membership lease); fail past `deadline`.
    pub fn wait_ready(&self, which: impl Iterator<Item = usize>, peers: usize, deadline: Duration) {
        let started = Instant::now();
        let wanted = format!("chorus_peers_connected:{peers}");
        for node in which {
            loop {
                let info = self
                    .connect(node, Duration::from_secs(30))
                    .and_then(|mut con| redis::cmd("INFO").arg("replication").query::<String>(&mut con));
                let ready = info
                    .as_ref()
                    .is_ok_and(|info| info.contains(&wanted) && info.contains("chorus_operational:1"));
                if ready {
                    break;
                }
                assert!(
                    started.elapsed() < deadline,
                    "node {node} never became ready at {}; last answer: {info:?}",
                    self.client_addr(node)
                );
                thread::sleep(Duration::from_millis(50));
            }
        }
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

/// `chorus` processes in a lab's namespaces, one slot per node, killed when dropped; their
/// logs (`node-<n>.log`) and data directories (`node-<n>`) are in `dir`, kept if the test
/// failed.
pub struct Nodes {
    pub children: Vec<Option<Child>>,
    pub dir: PathBuf,
}

impl Nodes {
    /// `count` slots, none running, in a fresh `chorus-<tag>-<pid>-<run>` directory.
    pub fn new(tag: &str, count: usize) -> Nodes {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let run = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("chorus-{tag}-{}-{run}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Nodes { children: (0..count).map(|_| None).collect(), dir }
    }

    /// Node `node`'s data directory (a restart keeps it).
    pub fn data_dir(&self, node: usize) -> PathBuf {
        self.dir.join(format!("node-{node}"))
    }

    /// Start `chorus <args>` as node `node` in its namespace, its stderr appended to its log.
    pub fn start<S: AsRef<OsStr>>(&mut self, lab: &Lab, node: usize, args: impl IntoIterator<Item = S>) {
        assert!(self.children[node].is_none(), "node {node} is still running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("node-{node}.log")))
            .unwrap();
        let child = lab
            .command_in(node, env!("CARGO_BIN_EXE_chorus"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start chorus node in its namespace");
        self.children[node] = Some(child);
    }

    /// SIGKILL node `node` and reap it.
    pub fn kill(&mut self, node: usize) {
        let mut child = self.children[node].take().expect("node running");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// Send node `node` `signal` (SIGSTOP, SIGCONT); it keeps its slot.
    pub fn signal(&self, node: usize, signal: libc::c_int) {
        let pid = self.children[node].as_ref().expect("node running").id() as libc::pid_t;
        super::send_signal(pid, signal);
    }

    /// What node `node` has logged so far.
    pub fn log(&self, node: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("node-{node}.log"))).unwrap()
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        super::stop_processes(self.children.iter_mut().filter_map(Option::take), &self.dir);
    }
}
