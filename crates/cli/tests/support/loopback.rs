//! Real `chorus node` processes on loopback: start a cluster on free ports, wait until every
//! node has its peer links up, connect clients, kill nodes. Children are killed when the
//! cluster is dropped, whether the test passed or panicked.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

pub const DEADLINE: Duration = Duration::from_secs(60);

pub struct Node {
    pub client: SocketAddr,
    pub peer: SocketAddr,
    pub log: PathBuf,
    pub child: Option<Child>,
    /// The `chorus` arguments it was started with, for restarts.
    pub args: Vec<String>,
}

pub struct Cluster {
    pub nodes: Vec<Node>,
    pub dir: PathBuf,
    /// Applied to every node's command before it starts (and restarts).
    prepare: fn(&mut Command),
    /// Sent with the readiness probe and by [`Cluster::client`], when the nodes have one.
    pub password: Option<String>,
}

/// Distinct free loopback ports, below Linux's ephemeral range (32768-60999): a port the
/// kernel handed out with `bind(:0)` comes from that range, and between our check and the
/// node's bind it can be taken as another connection's source port (a node then exits with
/// 'Address already in use'). Each process walks its own cursor from a pid-derived start,
/// past the lanes of [`super::up::free_port_run`], holding every listener until all are chosen.
pub fn free_addrs(count: usize) -> Vec<SocketAddr> {
    const LOW_PORT: usize = 10_000;
    const HIGH_PORT: usize = 32_768;
    static CURSOR: AtomicUsize = AtomicUsize::new(0);
    let start = (std::process::id() as usize % 8_000) + 8 * 500;
    let mut held = Vec::with_capacity(count);
    for _attempt in 0..(HIGH_PORT - LOW_PORT) {
        if held.len() == count {
            break;
        }
        let offset = (start + CURSOR.fetch_add(1, Ordering::Relaxed)) % (HIGH_PORT - LOW_PORT);
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", (LOW_PORT + offset) as u16)) {
            held.push(listener);
        }
    }
    assert_eq!(held.len(), count, "{count} free ports below the ephemeral range");
    held.iter().map(|listener| listener.local_addr().unwrap()).collect()
}

impl Cluster {
    pub fn start(replicas: usize, extra_args: &[&str]) -> Cluster {
        Cluster::start_with(replicas, extra_args, |_| {})
    }

    /// [`Cluster::start`], with `prepare` applied to each node's command (its environment,
    /// its resource limits) before it is spawned.
    pub fn start_with(replicas: usize, extra_args: &[&str], prepare: fn(&mut Command)) -> Cluster {
        let extra: Vec<String> = extra_args.iter().map(|arg| arg.to_string()).collect();
        Cluster::launch(replicas, |_, _| extra.clone(), prepare)
    }

    /// Like [`Cluster::start`], with arguments per node: `args_of(i, dir)` (`dir` is the
    /// cluster's scratch directory, e.g. for certificates).
    pub fn start_each(replicas: usize, args_of: impl Fn(usize, &std::path::Path) -> Vec<String>) -> Cluster {
        Cluster::launch(replicas, args_of, |_| {})
    }

    /// Start the nodes on free ports and wait until all are ready. A node that could not
    /// bind a port chosen free a moment before (another process took it in between: the
    /// race [`free_addrs`] narrows but cannot close) makes it start again on other ports,
    /// up to three times; any other exit fails the test.
    fn launch(
        replicas: usize,
        args_of: impl Fn(usize, &std::path::Path) -> Vec<String>,
        prepare: fn(&mut Command),
    ) -> Cluster {
        const ATTEMPTS: usize = 3;
        for attempt in 1..=ATTEMPTS {
            let mut cluster = Cluster::spawn_nodes(replicas, &args_of, prepare);
            match (0..replicas).try_for_each(|i| cluster.wait_ready_or_exit(i, replicas - 1)) {
                Ok(()) => return cluster,
                Err(exit) if exit.contains("Address already in use") && attempt < ATTEMPTS => {
                    eprintln!("starting the cluster again on other ports: {exit}");
                }
                Err(exit) => panic!("{exit}"),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    fn spawn_nodes(
        replicas: usize,
        args_of: &impl Fn(usize, &std::path::Path) -> Vec<String>,
        prepare: fn(&mut Command),
    ) -> Cluster {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "chorus-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let addrs = free_addrs(2 * replicas);
        let password =
            args_of(0, &dir).windows(2).find(|pair| pair[0] == "--requirepass").map(|pair| pair[1].clone());
        let mut cluster = Cluster { nodes: Vec::new(), dir: dir.clone(), prepare, password };
        for i in 0..replicas {
            let (client, peer) = (addrs[2 * i], addrs[2 * i + 1]);
            let log = dir.join(format!("node-{i}.log"));
            let mut args: Vec<String> = vec![
                "node".into(),
                "--node-id".into(),
                i.to_string(),
                "--client-addr".into(),
                client.to_string(),
                "--cluster-token".into(),
                "test-token-0123456789".into(),
                "--data-dir".into(),
                dir.join(format!("node-{i}")).to_str().unwrap().into(),
                "--log-level".into(),
                "info".into(),
            ];
            args.extend(args_of(i, &dir));
            for j in 0..replicas {
                args.extend(["--peer".to_string(), format!("{j}={}", addrs[2 * j + 1])]);
            }
            let child = spawn(&args, std::fs::File::create(&log).unwrap(), prepare);
            cluster.nodes.push(Node { client, peer, log, child: Some(child), args });
        }
        cluster
    }

    /// Wait until node `i` answers and has all its peer links up.
    pub fn wait_ready(&mut self, i: usize, peers: usize) {
        if let Err(exit) = self.wait_ready_or_exit(i, peers) {
            panic!("{exit}");
        }
    }

    /// [`Self::wait_ready`], or which node exited meanwhile, with its log.
    fn wait_ready_or_exit(&mut self, i: usize, peers: usize) -> Result<(), String> {
        let started = Instant::now();
        let wanted = format!("chorus_peers_connected:{peers}");
        // Serving needs a membership lease as well as peer links.
        let operational = "chorus_operational:1";
        loop {
            // A peer that exited (e.g. it could not bind) is the cause; name it, not node i.
            for j in 0..self.nodes.len() {
                let Some(child) = self.nodes[j].child.as_mut() else { continue };
                if let Some(status) = child.try_wait().unwrap() {
                    return Err(format!(
                        "node {j} exited ({status}) while node {i} waited for it:\n{}",
                        self.log(j)
                    ));
                }
            }
            if let Ok(mut con) = self.try_client(i) {
                let info: redis::RedisResult<String> = redis::cmd("INFO").arg("replication").query(&mut con);
                if info.is_ok_and(|info| info.contains(&wanted) && info.contains(operational)) {
                    return Ok(());
                }
            }
            assert!(started.elapsed() < DEADLINE, "node {i} not ready:\n{}", self.log(i));
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Every node's client address, for recording clients (`host:port`).
    pub fn client_targets(&self) -> Vec<String> {
        self.nodes.iter().map(|node| node.client.to_string()).collect()
    }

    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(&self.nodes[i].log).unwrap_or_default()
    }

    pub fn try_client(&self, i: usize) -> redis::RedisResult<redis::Connection> {
        let auth = self.password.as_ref().map_or(String::new(), |password| format!(":{password}@"));
        let client = redis::Client::open(format!("redis://{auth}{}/", self.nodes[i].client))?;
        let con = client.get_connection_with_timeout(Duration::from_secs(5))?;
        con.set_read_timeout(Some(Duration::from_secs(10)))?;
        con.set_write_timeout(Some(Duration::from_secs(10)))?;
        Ok(con)
    }

    pub fn client(&self, i: usize) -> redis::Connection {
        self.try_client(i).unwrap_or_else(|error| panic!("connect to node {i}: {error}"))
    }

    /// Start node `i` again with its data directory and `extra_args` (e.g. `--join ADDR`);
    /// its log continues in the same file.
    pub fn restart(&mut self, i: usize, extra_args: &[&str]) {
        assert!(self.nodes[i].child.is_none(), "node {i} is still running");
        let mut args = self.nodes[i].args.clone();
        args.extend(extra_args.iter().map(|arg| arg.to_string()));
        let log = std::fs::OpenOptions::new().append(true).open(&self.nodes[i].log).unwrap();
        self.nodes[i].child = Some(spawn(&args, log, self.prepare));
    }

    /// One line of node `i`'s INFO (e.g. `hermes_keys_copied`), as a number.
    pub fn info_number(&self, i: usize, field: &str) -> Option<u64> {
        let mut con = self.try_client(i).ok()?;
        let info: String = redis::cmd("INFO").query(&mut con).ok()?;
        let prefix = format!("{field}:");
        info.lines().find_map(|line| line.strip_prefix(&prefix)).and_then(|value| value.trim().parse().ok())
    }

    /// Poll `done` every 20 ms until it holds; past [`DEADLINE`], fail with `what` and node
    /// `node`'s log.
    pub fn wait_until(&self, what: &str, node: usize, mut done: impl FnMut(&Cluster) -> bool) {
        let started = Instant::now();
        while !done(self) {
            assert!(started.elapsed() < DEADLINE, "{what}:\n{}", self.log(node));
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// The integer at `key` on node `i` (0 if unset), retrying for 30 s while the node is
    /// not yet serving (just restarted).
    pub fn counter(&self, i: usize, key: &str) -> i64 {
        let started = Instant::now();
        loop {
            let result: redis::RedisResult<Option<i64>> =
                self.try_client(i).and_then(|mut con| redis::cmd("GET").arg(key).query(&mut con));
            match result {
                Ok(value) => return value.unwrap_or(0),
                Err(error) => {
                    assert!(started.elapsed() < Duration::from_secs(30), "GET {key} at node {i}: {error}");
                    thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }

    /// The names of node `i`'s threads (Linux).
    pub fn thread_names(&self, i: usize) -> std::collections::BTreeSet<String> {
        let pid = self.nodes[i].child.as_ref().expect("running").id();
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("linux /proc");
        tasks
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
            .map(|name| name.trim().to_string())
            .collect()
    }

    /// Six recording clients over every node while node `victim` is SIGKILLed and restarted:
    /// the history must be linearizable and more than half of it completed.
    pub fn assert_linearizable_across_a_kill(&mut self, victim: usize) {
        use chorus_sim::checker::{check_history, CheckerConfig};

        let clients = background_clients(self, 200, Duration::from_secs(3), Duration::from_millis(3));
        thread::sleep(Duration::from_millis(400));
        self.sigkill(victim);
        thread::sleep(Duration::from_millis(150));
        self.restart(victim, &[]);
        self.wait_ready(victim, self.nodes.len() - 1);
        let history = clients.join().unwrap();
        let report = check_history(&history, &CheckerConfig::default());
        assert!(report.violations.is_empty(), "not linearizable: {:?}", report.violations);
        let completed = history.operations.iter().filter(|op| op.completion.is_some()).count();
        assert!(completed > history.operations.len() / 2, "too few completed: {completed}");
    }

    pub fn sigkill(&mut self, i: usize) {
        let mut child = self.nodes[i].child.take().unwrap();
        child.kill().unwrap(); // SIGKILL on Unix
        child.wait().unwrap();
    }

    /// A power cut of the whole cluster: SIGKILL every node at once, restart each on its data
    /// directory, and wait until each serves with all the others.
    pub fn power_loss(&mut self) {
        let nodes = self.nodes.len();
        for node in 0..nodes {
            self.sigkill(node);
        }
        for node in 0..nodes {
            self.restart(node, &[]);
        }
        for node in 0..nodes {
            self.wait_ready(node, nodes - 1);
        }
    }

    /// Every node holds each counter at no less than the largest value an acknowledged INCR
    /// returned, and no more than the INCRs tried (`promised`: key -> (largest, tried)).
    pub fn assert_counters_kept(
        &self,
        promised: &std::collections::BTreeMap<Vec<u8>, (i64, i64)>,
        after: &str,
    ) {
        for (key, (max_acked, attempts)) in promised {
            let key = std::str::from_utf8(key).unwrap();
            for node in 0..self.nodes.len() {
                let value = self.counter(node, key);
                assert!(
                    (*max_acked..=*attempts).contains(&value),
                    "{key} at node {node} after {after}: {value}, acknowledged up to {max_acked}, \
                     {attempts} attempts"
                );
            }
        }
    }

    /// Send node `i` `signal` (SIGSTOP, SIGCONT, SIGTERM); it keeps its place.
    pub fn signal(&self, i: usize, signal: libc::c_int) {
        let pid = self.nodes[i].child.as_ref().expect("node running").id() as libc::pid_t;
        super::send_signal(pid, signal);
    }

    /// SIGTERM node `i` and wait (bounded) for it to exit: how it exited.
    pub fn sigterm(&mut self, i: usize) -> std::process::ExitStatus {
        self.signal(i, libc::SIGTERM);
        let mut child = self.nodes[i].child.take().unwrap();
        let started = Instant::now();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if started.elapsed() > DEADLINE {
                let _ = child.kill();
                panic!("node {i} did not stop after SIGTERM:\n{}", self.log(i));
            }
            thread::sleep(Duration::from_millis(10));
        }
    }
}

fn spawn(args: &[String], log: std::fs::File, prepare: fn(&mut Command)) -> Child {
    let mut command = Command::new(env!("CARGO_BIN_EXE_chorus"));
    command.args(args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
    prepare(&mut command);
    command.spawn().expect("start chorus node")
}

impl Drop for Cluster {
    fn drop(&mut self) {
        super::stop_processes(self.nodes.iter_mut().filter_map(|node| node.child.take()), &self.dir);
    }
}

/// Six clients on a fresh 3-node cluster of `protocol` (reads, writes, CAS, INCR on four hot
/// keys), then the history must be linearizable.
pub fn assert_concurrent_clients_linearizable(protocol: &str) {
    assert_concurrent_clients_linearizable_with(protocol, &[]);
}

/// [`assert_concurrent_clients_linearizable`] with `extra` arguments for every node; returns
/// the cluster for further checks.
pub fn assert_concurrent_clients_linearizable_with(protocol: &str, extra: &[&str]) -> Cluster {
    use chorus_sim::checker::{check_history, CheckerConfig};

    use super::workload::{self, Workload};

    let mut args = vec!["--protocol", protocol];
    args.extend_from_slice(extra);
    let cluster = Cluster::start(3, &args);
    let history = workload::run(Workload {
        targets: cluster.client_targets(),
        clients: 6,
        ops_per_client: 300,
        reply_timeout: Duration::from_secs(10),
        think: Duration::ZERO,
    });
    let completed = history.operations.iter().filter(|op| op.completion.is_some()).count();
    let report = check_history(&history, &CheckerConfig::default());
    eprintln!(
        "{protocol}: {} operations ({completed} completed), {} keys checked, inconclusive: {:?}",
        history.operations.len(),
        report.keys_checked,
        report.inconclusive_keys
    );
    assert!(report.is_linearizable(), "violations: {:#?}", report.violations);
    assert_eq!(report.keys_checked, 4);
    assert!(completed > 0);
    cluster
}

/// Keys `prefix0`, `prefix1`, ... until one lands on event loop (raftlog: shard) `part` of
/// `parts`.
pub fn key_on_loop(part: usize, parts: usize, prefix: &str) -> String {
    (0..)
        .map(|index| format!("{prefix}{index}"))
        .find(|key| chorus_raftlog::shard_of(key.as_bytes(), parts) == part)
        .expect("some key is on every loop")
}

/// Keys the kill-and-rejoin tests write: `bulk:<i>` = `v<i>` before the failure, then the
/// first [`Bulk::OVERWRITTEN`] overwritten with `down<i>` while a node is down, which a
/// rejoined node must have copied.
pub struct Bulk {
    pub keys: usize,
}

impl Bulk {
    pub const OVERWRITTEN: usize = 50;

    pub fn write_initial(&self, cluster: &Cluster, node: usize) {
        let mut con = cluster.client(node);
        for i in 0..self.keys {
            let _: () =
                redis::cmd("SET").arg(format!("bulk:{i}")).arg(format!("v{i}")).query(&mut con).unwrap();
        }
    }

    pub fn overwrite_while_down(&self, cluster: &Cluster, node: usize) {
        let mut con = cluster.client(node);
        for i in 0..Self::OVERWRITTEN {
            let _: () =
                redis::cmd("SET").arg(format!("bulk:{i}")).arg(format!("down{i}")).query(&mut con).unwrap();
        }
    }

    /// `node` serves the latest value of every key.
    pub fn assert_latest_at(&self, cluster: &Cluster, node: usize) {
        let mut con = cluster.client(node);
        for i in 0..self.keys {
            let value: Option<String> = redis::cmd("GET").arg(format!("bulk:{i}")).query(&mut con).unwrap();
            let expected = if i < Self::OVERWRITTEN { format!("down{i}") } else { format!("v{i}") };
            assert_eq!(value.as_deref(), Some(expected.as_str()), "bulk:{i} at n{node}");
        }
    }
}

/// Six recording clients spread over every node, in the background.
pub fn background_clients(
    cluster: &Cluster,
    ops_per_client: usize,
    reply_timeout: Duration,
    think: Duration,
) -> thread::JoinHandle<chorus_sim::history::History> {
    let targets = cluster.client_targets();
    super::workload::spawn(super::workload::Workload {
        targets,
        clients: 6,
        ops_per_client,
        reply_timeout,
        think,
    })
}
