//! `chorus up` keeps a cluster (issue 24 point 4): its default directory survives a reboot,
//! and `chorus up` on a directory that holds a cluster restarts that cluster, keys included.

use std::io::{BufRead, BufReader, Lines};
use std::net::TcpListener;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

use support::scratch::Scratch;

mod support;

/// A base port with `count` free ports after it (for `chorus up`, which numbers them);
/// each test its own `lane`, since they run at the same time.
fn free_port_run(count: u16, lane: u16) -> u16 {
    let start = 30_000 + (std::process::id() % 20_000) as u16 + lane * 500;
    (start..60_000)
        .step_by(count as usize)
        .find(|base| (0..count).all(|i| TcpListener::bind(("127.0.0.1", base + i)).is_ok()))
        .expect("a run of free ports")
}

/// `chorus up` as a child; killed (SIGKILL) if the test ends without stopping it. Its
/// stdout stays open: `chorus up` writes to it until it exits.
struct Up {
    child: Child,
    _stdout: Lines<BufReader<ChildStdout>>,
}

impl Up {
    /// Start `chorus up` and read the first line it prints; `Err`: what it said on stderr
    /// when it exited instead.
    fn start(port: u16, args: &[&str], env: &[(&str, &std::path::Path)]) -> Result<(Up, String), String> {
        let mut command = Command::new(env!("CARGO_BIN_EXE_chorus"));
        command
            .args([
                "up",
                "--replicas",
                "3",
                "--port",
                &port.to_string(),
                "--peer-port",
                &(port + 3).to_string(),
            ])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.spawn().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        match lines.next() {
            Some(line) => Ok((Up { child, _stdout: lines }, line.unwrap())),
            None => Err(String::from_utf8_lossy(&child.wait_with_output().unwrap().stderr).into_owned()),
        }
    }

    /// SIGTERM, as Ctrl-C: `chorus up` stops its nodes and exits.
    fn stop(mut self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        assert!(status.success(), "chorus up exited with {status}");
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn client(port: u16) -> redis::Connection {
    let con = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(10))
        .unwrap();
    con.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    con
}

#[test]
fn chorus_up_on_its_directory_restarts_the_same_cluster_with_its_keys() {
    let scratch = Scratch::new("up-restart");
    let port = free_port_run(6, 0);
    // The default directory is under XDG_DATA_HOME (else ~/.local/share), per port.
    let (up, first) = Up::start(port, &[], &[("XDG_DATA_HOME", &scratch.0)]).unwrap();
    let dir = scratch.0.join("chorus").join(format!("up-{port}"));
    assert!(first.contains(&dir.display().to_string()), "{first}");
    assert!(first.contains("data kept across restarts"), "{first}");
    for i in 0..30u16 {
        let mut con = client(port + i % 3);
        let _: () = redis::cmd("SET").arg(format!("k:{i}")).arg(format!("v:{i}")).query(&mut con).unwrap();
    }
    up.stop();

    let (up, first) = Up::start(port, &["--data-dir", dir.to_str().unwrap()], &[]).unwrap();
    assert!(first.contains("restarted from the data kept"), "{first}");
    for node in 0..3u16 {
        let mut con = client(port + node);
        for i in 0..30 {
            let value: Option<String> = redis::cmd("GET").arg(format!("k:{i}")).query(&mut con).unwrap();
            assert_eq!(value.as_deref(), Some(format!("v:{i}").as_str()), "k:{i} at replica {node}");
        }
    }
    up.stop();

    // Another protocol on the same directory is refused, saying what the directory holds.
    let error = Up::start(port, &["--data-dir", dir.to_str().unwrap(), "--protocol", "craq"], &[])
        .err()
        .expect("chorus up must refuse another protocol on this directory");
    assert!(error.contains("holds a 3-replica hermes cluster"), "{error}");
}

#[test]
fn chorus_up_in_memory_keeps_nothing() {
    let port = free_port_run(6, 1);
    let (up, first) = Up::start(port, &["--in-memory"], &[]).unwrap();
    assert!(first.contains("in memory: nothing is kept"), "{first}");
    let dir = first.split("logs in ").nth(1).and_then(|rest| rest.split(';').next()).unwrap().to_string();
    assert!(std::path::Path::new(&dir).is_dir(), "{dir}");
    let info: String = redis::cmd("INFO").arg("persistence").query(&mut client(port)).unwrap();
    assert!(info.contains("aof_enabled:0"), "{info}");
    up.stop();
    assert!(!std::path::Path::new(&dir).exists(), "{dir} is removed on exit");
}

/// Issue 17 point 5, step 1: `--chain-shape kernel` gives every node a chain region that fits
/// one slot of the kernel data path (1 MiB instead of 69 MiB), which serves and refuses what
/// does not fit with a clear error. The chain keeps no keys across a `chorus up` restart (its
/// nodes start as a new cluster, so no region is trusted): the restart starts empty, in
/// whatever shape it is given, at every replica alike.
#[test]
fn chorus_up_chain_with_the_kernel_shape_maps_one_mib_regions() {
    let scratch = Scratch::new("up-chain-shape");
    let port = free_port_run(6, 2);
    let dir = scratch.0.join("cluster");
    let args = ["--protocol", "chain", "--chain-shape", "kernel", "--data-dir", dir.to_str().unwrap()];
    let (up, _) = Up::start(port, &args, &[]).unwrap();
    for node in 0..3 {
        let region = dir.join(format!("node-{node}/regions/tenant-0/chain.region"));
        let bytes = std::fs::metadata(&region).unwrap().len();
        assert_eq!(bytes, chorus_chain::ChainLayout::kernel_slot().region_bytes(), "{}", region.display());
        assert_eq!(bytes, 1024 * 1024);
    }
    let mut con = client(port);
    let _: () = redis::cmd("SET").arg("k").arg("v").query(&mut con).unwrap();
    let value: Option<String> = redis::cmd("GET").arg("k").query(&mut client(port + 2)).unwrap();
    assert_eq!(value.as_deref(), Some("v"));
    // The shape's log holds records of 64 KiB: a larger value is refused, nothing changes.
    let error = redis::cmd("SET").arg("k").arg(vec![7u8; 70 * 1024]).query::<()>(&mut con).unwrap_err();
    assert!(error.to_string().contains("chain_log_bytes"), "{error}");
    let value: Option<String> = redis::cmd("GET").arg("k").query(&mut con).unwrap();
    assert_eq!(value.as_deref(), Some("v"));
    up.stop();

    let (up, first) = Up::start(port, &["--protocol", "chain", "--data-dir", dir.to_str().unwrap()], &[])
        .expect("the restart does not reopen the kernel-shape regions");
    assert!(first.contains("keys in memory"), "{first}");
    let region = dir.join("node-0/regions/tenant-0/chain.region");
    assert_eq!(std::fs::metadata(&region).unwrap().len(), chorus_chain::ChainLayout::server().region_bytes());
    for node in 0..3 {
        let value: Option<String> = redis::cmd("GET").arg("k").query(&mut client(port + node)).unwrap();
        assert_eq!(value, None, "replica {node} starts empty like the others");
    }
    up.stop();
    let error = Up::start(port, &["--chain-shape", "kernel"], &[]).err().expect("hermes has no chain shape");
    assert!(error.contains("only applies to --protocol chain"), "{error}");
}
