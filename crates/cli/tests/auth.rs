//! Clients authenticating, and what a node refuses to expose (issue 22, points 5, 6, 11),
//! through the real binary and a real Redis client library (the `redis` crate).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::loopback::{free_addrs, DEADLINE};
use support::scratch::Scratch;

mod support;

/// `chorus up` as a child; killed (SIGKILL) if the test ends without stopping it.
struct Up(Option<Child>);

impl Drop for Up {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn redis_client(url: &str) -> redis::RedisResult<redis::Connection> {
    let con = redis::Client::open(url)?.get_connection_with_timeout(Duration::from_secs(10))?;
    con.set_read_timeout(Some(Duration::from_secs(10)))?;
    Ok(con)
}

#[test]
fn chorus_up_with_requirepass_starts_and_clients_must_authenticate() {
    let port = support::up::free_port_run(6, 0);
    let scratch = Scratch::new("auth-up");
    let mut child = Command::new(env!("CARGO_BIN_EXE_chorus"))
        .args(["up", "--replicas", "3", "--port", &port.to_string(), "--peer-port", &(port + 3).to_string()])
        .args(["--requirepass", "s3cret pass", "--data-dir", scratch.0.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let up = Up(Some(child));
    // The readiness check authenticates: without that, `up` never reports the cluster up.
    let mut lines = BufReader::new(stdout).lines();
    let first = lines.next().expect("chorus up printed nothing").unwrap();
    assert!(first.contains("3 hermes replicas up"), "{first}");

    let addr = format!("127.0.0.1:{port}");
    // No password: every command but AUTH, HELLO and QUIT answers NOAUTH.
    let mut anonymous = redis_client(&format!("redis://{addr}/")).unwrap();
    let error = redis::cmd("GET").arg("k").query::<Option<String>>(&mut anonymous).unwrap_err();
    assert_eq!(error.code(), Some("NOAUTH"), "{error}");
    let error = redis::cmd("AUTH").arg("wrong").query::<()>(&mut anonymous).unwrap_err();
    assert_eq!(error.code(), Some("WRONGPASS"), "{error}");
    let _: () = redis::cmd("AUTH").arg("s3cret pass").query(&mut anonymous).unwrap();
    let _: () = redis::cmd("SET").arg("k").arg("v").query(&mut anonymous).unwrap();

    // The library's own AUTH (RESP2) and HELLO 3 AUTH (RESP3), on every replica.
    for i in 0..3 {
        let addr = format!("127.0.0.1:{}", port + i);
        for protocol in ["resp2", "resp3"] {
            let url = format!("redis://default:s3cret%20pass@{addr}/?protocol={protocol}");
            let mut con = redis_client(&url).unwrap_or_else(|error| panic!("{url}: {error}"));
            let value: Option<String> = redis::cmd("GET").arg("k").query(&mut con).unwrap();
            assert_eq!(value.as_deref(), Some("v"), "{url}");
        }
        let url = format!("redis://default:nope@{addr}/?protocol=resp3");
        let error = redis_client(&url).err().expect("HELLO 3 AUTH with a wrong password must fail");
        assert!(error.to_string().contains("WRONGPASS"), "{error}");
    }
    drop(up);
}

#[test]
fn a_node_on_an_open_address_without_a_password_refuses_to_start() {
    let port = free_addrs(2);
    let client = format!("0.0.0.0:{}", port[0].port());
    let peer = format!("0=127.0.0.1:{}", port[1].port());
    let scratch = Scratch::new("auth-protected");
    let log = scratch.0.join("node.log");
    let child = Command::new(env!("CARGO_BIN_EXE_chorus"))
        .args(["node", "--node-id", "0", "--client-addr", &client, "--peer", &peer])
        .env("CHORUS_CLUSTER_TOKEN", "token-from-the-environment")
        .env_remove("CHORUS_REQUIREPASS")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut node = Up(Some(child));
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = node.0.as_mut().unwrap().try_wait().unwrap() {
            break status;
        }
        assert!(started.elapsed() < DEADLINE, "the node started on {client} without a password");
        std::thread::sleep(Duration::from_millis(20));
    };
    node.0 = None;
    assert!(!status.success());
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert!(stderr.contains("`protected-mode`") && stderr.contains("requirepass"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}

#[test]
fn secrets_come_from_the_environment_and_node_files_are_private() {
    use std::os::unix::fs::PermissionsExt as _;
    let addrs = free_addrs(2);
    let scratch = Scratch::new("auth-env");
    let data_dir = scratch.0.join("node-0");
    // Listening on every interface is allowed with a password (protected mode); the token and
    // the password come from the environment only.
    let child = Command::new(env!("CARGO_BIN_EXE_chorus"))
        .args(["node", "--node-id", "0", "--data-dir", data_dir.to_str().unwrap()])
        .args(["--client-addr", &SocketAddr::from(([0, 0, 0, 0], addrs[0].port())).to_string()])
        .args(["--peer", &format!("0={}", addrs[1])])
        .env("CHORUS_REQUIREPASS", "from-env")
        .env("CHORUS_CLUSTER_TOKEN", "env-token-0123456789")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _node = Up(Some(child));
    let url = format!("redis://:from-env@127.0.0.1:{}/", addrs[0].port());
    let started = std::time::Instant::now();
    let mut con = loop {
        match redis_client(&url) {
            Ok(con) => break con,
            Err(error) => assert!(started.elapsed() < DEADLINE, "{error}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _: () = redis::cmd("SET").arg("k").arg("v").query(&mut con).unwrap();
    let mut anonymous = redis_client(&format!("redis://127.0.0.1:{}/", addrs[0].port())).unwrap();
    let error = redis::cmd("GET").arg("k").query::<Option<String>>(&mut anonymous).unwrap_err();
    assert_eq!(error.code(), Some("NOAUTH"));
    let mode = |path: &std::path::Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&data_dir), 0o700);
    assert_eq!(mode(&data_dir.join("membership.log")), 0o600);
}
