//! `chorus up` as a child process, for the tests of the command itself.

use std::io::{BufRead, BufReader, Lines};
use std::net::TcpListener;
use std::process::{Child, ChildStdout, Command, Stdio};

/// A base port with `count` free ports after it (for `chorus up`, which numbers them);
/// each test its own `lane`, since they run at the same time. Below 32768, the start of
/// Linux's ephemeral range: a port found free there could otherwise be taken, before the
/// node binds it, as the source port of any outgoing connection on the machine.
pub fn free_port_run(count: u16, lane: u16) -> u16 {
    assert!(lane < 16, "lanes are 500 ports apart below the ephemeral range");
    let start = 10_000 + (std::process::id() % 8_000) as u16 + lane * 500;
    (start..32_768 - count)
        .step_by(count as usize)
        .find(|base| (0..count).all(|i| TcpListener::bind(("127.0.0.1", base + i)).is_ok()))
        .expect("a run of free ports")
}

/// A connection to the node serving RESP on `port` of 127.0.0.1.
pub fn client(port: u16) -> redis::Connection {
    let con = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .unwrap()
        .get_connection_with_timeout(std::time::Duration::from_secs(10))
        .unwrap();
    con.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    con
}

/// The process id of the node serving RESP on `port` (INFO's `process_id`).
pub fn node_pid(port: u16) -> i32 {
    let info: String = redis::cmd("INFO").arg("server").query(&mut client(port)).unwrap();
    let line = info.lines().find(|line| line.starts_with("process_id:")).expect("INFO has process_id");
    line["process_id:".len()..].trim().parse().unwrap()
}

/// A child process killed (SIGKILL) and reaped when the test drops it.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// GET at `port` until it answers `want` (at most 30 s; a node not listening yet is waited
/// for).
pub fn wait_for_value(port: u16, key: &str, want: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let value: redis::RedisResult<Option<String>> =
            redis::Client::open(format!("redis://127.0.0.1:{port}/"))
                .and_then(|client| client.get_connection_with_timeout(std::time::Duration::from_secs(5)))
                .and_then(|mut con| redis::cmd("GET").arg(key).query(&mut con));
        if matches!(&value, Ok(Some(v)) if v == want) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{key} at {port}: {value:?}, expected {want}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// SET `key` to `value` at the node on `port`, again while it answers that the outcome is
/// unknown or to try again (a view change after a crash is still under way); a SET is
/// idempotent, so repeating it is what a client would do.
pub fn set_retrying(port: u16, key: &str, value: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let result = redis::cmd("SET").arg(key).arg(value).query::<()>(&mut client(port));
        match result {
            Ok(()) => return,
            Err(error) if std::time::Instant::now() < deadline => {
                assert!(matches!(error.code(), Some("UNKNOWN" | "TRYAGAIN")), "SET {key} at {port}: {error}");
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            Err(error) => panic!("SET {key} at {port} still failing after 20 s: {error}"),
        }
    }
}

/// `chorus up --port P --peer-port P+nodes ARGS` as a child; killed (SIGKILL) if the test
/// ends without stopping it. Its stdout stays open: `chorus up` writes to it until it exits.
pub struct Up {
    child: Child,
    _stdout: Lines<BufReader<ChildStdout>>,
}

impl Up {
    /// Start `chorus up` and read the first line it prints; `Err`: what it said on stderr
    /// when it exited instead.
    /// `nodes`: how many nodes `args` start (3 without --replicas or --shards); they use
    /// `2 * nodes` ports from `port` on (`3 * nodes` with --shards: the metadata service's).
    pub fn start(
        port: u16,
        nodes: u16,
        args: &[&str],
        env: &[(&str, &std::path::Path)],
    ) -> Result<(Up, String), String> {
        let mut command = Command::new(env!("CARGO_BIN_EXE_chorus"));
        command
            .args(["up", "--port", &port.to_string(), "--peer-port", &(port + nodes).to_string()])
            .args(["--meta-port", &(port + 2 * nodes).to_string()])
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

    /// `chorus up --protocol chain --datapath DATAPATH` with its group hosts on `port + 6`
    /// onwards and its data under `dir`, started and past its first line ("3 chain replicas
    /// up"), which it returns (it says there when the kernel path is unavailable).
    pub fn hosted_chain(port: u16, datapath: &str, dir: &std::path::Path) -> (Up, String) {
        let host_port = (port + 6).to_string();
        let args = [
            "--protocol",
            "chain",
            "--datapath",
            datapath,
            "--group-host-port",
            &host_port,
            "--data-dir",
            dir.to_str().unwrap(),
        ];
        let (up, first) = Up::start(port, 3, &args, &[]).unwrap();
        assert!(first.contains("3 chain replicas up"), "{first}");
        (up, first)
    }

    /// SIGTERM, as Ctrl-C: `chorus up` stops its nodes and exits.
    pub fn stop(mut self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        assert!(status.success(), "chorus up exited with {status}");
    }
}

impl Drop for Up {
    /// After a failed assertion: SIGTERM first, so that `chorus up` stops its nodes and
    /// removes an --in-memory directory; SIGKILL if it has not exited within 10 s.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            for _ in 0..200 {
                if !matches!(self.child.try_wait(), Ok(None)) {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
