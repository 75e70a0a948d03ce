//! Starting and stopping the systems `chorus bench compare` measures: Chorus, Redis and etcd
//! processes on 127.0.0.1, data under /dev/shm. Every child is owned by a [`Procs`] guard that
//! stops it (SIGTERM, then SIGKILL) when dropped, on errors and panics too; on Linux children
//! also get SIGKILL if this process dies (`PR_SET_PDEATHSIG`; children are started from the
//! main thread, which lives as long as the process).

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use crate::resp;

const STOP_TIMEOUT: Duration = Duration::from_secs(5);
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Child processes and their scratch directory, stopped and removed on drop.
pub struct Procs {
    pub name: String,
    children: Vec<(String, Child, PathBuf)>,
    /// Each child's label and command line, for the report.
    commands: Vec<(String, String)>,
    dir: PathBuf,
}

impl Procs {
    pub fn new(name: &str, dir: PathBuf) -> anyhow::Result<Procs> {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        Ok(Procs { name: name.to_string(), children: Vec::new(), commands: Vec::new(), dir })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The process ids of the running children.
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(|(_, child, _)| child.id()).collect()
    }

    /// Every child started: its label and its command line (the configuration a report prints).
    pub fn commands(&self) -> &[(String, String)] {
        &self.commands
    }

    /// Starts `command` with its output in `<dir>/<label>.log`.
    pub fn spawn(&mut self, label: &str, mut command: Command) -> anyhow::Result<()> {
        let mut words = vec![command.get_program().to_string_lossy().into_owned()];
        for arg in command.get_args() {
            // The cluster token is a secret even when it is a throw-away one.
            let secret = words.last().is_some_and(|last| last == "--cluster-token");
            words.push(if secret { "<token>".to_string() } else { arg.to_string_lossy().into_owned() });
        }
        let line = words.join(" ");
        self.commands.push((label.to_string(), line));
        let log = self.dir.join(format!("{label}.log"));
        let file = std::fs::File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
        command.stdin(Stdio::null()).stdout(file.try_clone()?).stderr(file);
        die_with_parent(&mut command);
        let program = command.get_program().to_string_lossy().into_owned();
        let child = command.spawn().with_context(|| format!("cannot start {program}"))?;
        self.children.push((label.to_string(), child, log));
        Ok(())
    }

    /// Fails (with the end of its log) if a child has exited.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        for (label, child, log) in &mut self.children {
            if let Some(status) = child.try_wait()? {
                bail!("{label} exited ({status}):\n{}", tail(log));
            }
        }
        Ok(())
    }

    pub fn stop(&mut self) {
        for (_, child, _) in &self.children {
            terminate(child);
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        for (label, child, _) in &mut self.children {
            while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            if matches!(child.try_wait(), Ok(None)) {
                eprintln!("chorus bench: {label} did not stop in time; killing it");
                let _ = child.kill();
            }
            let _ = child.wait();
        }
        self.children.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
        // The shared scratch root goes with its last run; remove_dir refuses while others remain.
        if let Some(root) = self.dir.parent().filter(|parent| *parent == scratch_root()) {
            let _ = std::fs::remove_dir(root);
        }
    }
}

/// Start `replicas` `chorus node --protocol <protocol>` processes on 127.0.0.1 (free ports,
/// data under `procs`' directory, each command line after `prefix`, e.g. `nice -n -10`) and
/// wait until every one has its peers connected and serves. Returns their client addresses.
pub fn start_chorus_cluster(
    procs: &mut Procs,
    exe: &Path,
    protocol: &str,
    replicas: usize,
    prefix: &[String],
    stop: &AtomicBool,
) -> anyhow::Result<Vec<SocketAddr>> {
    let ports = free_ports(2 * replicas)?;
    let token =
        format!("bench-token-{}-{:x}", std::process::id(), Instant::now().elapsed().as_nanos() ^ 0x5eed);
    let cluster_id = format!("chorus-bench-{}-{}", std::process::id(), procs.name);
    let mut targets = Vec::new();
    for i in 0..replicas {
        let mut command = match prefix.split_first() {
            None => Command::new(exe),
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(exe);
                command
            }
        };
        command
            .arg("node")
            .args(["--node-id", &i.to_string()])
            .args(["--protocol", protocol])
            .args(["--client-addr", &localhost(ports[i]).to_string()])
            .args(["--cluster-token", &token])
            .args(["--cluster-id", &cluster_id])
            .arg("--data-dir")
            .arg(procs.dir().join(format!("node-{i}")))
            .args(["--log-level", "warn"]);
        for j in 0..replicas {
            command.args(["--peer", &format!("{j}={}", localhost(ports[replicas + j]))]);
        }
        procs.spawn(&format!("node-{i}"), command)?;
        targets.push(localhost(ports[i]));
    }
    let peers = format!("chorus_peers_connected:{}", replicas - 1);
    for &target in &targets {
        wait_until(procs, &format!("{protocol} node"), stop, || {
            resp_text(target, &[b"INFO", b"replication"])
                .is_ok_and(|info| info.contains(&peers) && info.contains("chorus_operational:1"))
        })?;
    }
    Ok(targets)
}

impl Drop for Procs {
    fn drop(&mut self) {
        self.stop();
    }
}

fn terminate(child: &Child) {
    // SAFETY: kill(2) on a pid we own with a valid signal has no memory effects.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
}

fn die_with_parent(command: &mut Command) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt as _;
        // SAFETY: prctl is async-signal-safe and the closure allocates nothing.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = command;
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// `count` distinct free ports on 127.0.0.1 (all listeners held until every port is chosen).
pub fn free_ports(count: usize) -> anyhow::Result<Vec<u16>> {
    let listeners: Vec<TcpListener> =
        (0..count).map(|_| TcpListener::bind("127.0.0.1:0")).collect::<Result<_, _>>()?;
    Ok(listeners.iter().map(|l| l.local_addr().map(|a| a.port())).collect::<Result<_, _>>()?)
}

pub fn localhost(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Sends one RESP command and returns the raw reply as text (for INFO and the like).
pub fn resp_text(addr: SocketAddr, args: &[&[u8]]) -> anyhow::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut out = Vec::new();
    resp::encode(&mut out, args);
    stream.write_all(&out)?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some((_, used)) = resp::parse(&buf)? {
            return Ok(String::from_utf8_lossy(&buf[..used]).into_owned());
        }
        let read = stream.read(&mut chunk)?;
        if read == 0 {
            bail!("{addr} closed the connection");
        }
        buf.extend_from_slice(&chunk[..read]);
    }
}

/// Polls `ready` every 50 ms until it is true, a child exits, the deadline passes, or `stop`.
pub fn wait_until(
    procs: &mut Procs,
    what: &str,
    stop: &AtomicBool,
    mut ready: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        procs.check_running()?;
        if ready() {
            return Ok(());
        }
        if stop.load(Ordering::Relaxed) {
            bail!("interrupted");
        }
        if Instant::now() > deadline {
            bail!("{what} not ready after {} s (logs in {})", START_TIMEOUT.as_secs(), procs.dir().display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Finds `program` on PATH (or at one of `also`).
pub fn find_program(program: &str, also: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .chain(also.iter().map(PathBuf::from))
        .find(|candidate| candidate.is_file())
}

/// Finds `program`, installing Debian package `package` with apt-get when it is missing.
pub fn ensure_program(program: &str, also: &[&str], package: &str, install: bool) -> anyhow::Result<PathBuf> {
    if let Some(found) = find_program(program, also) {
        return Ok(found);
    }
    if !install {
        bail!("{program} not found (install the Debian package {package}, or drop --no-install)");
    }
    eprintln!("chorus bench: {program} not found; running apt-get install -y {package}");
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "-q", package])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null())
            .status()
    };
    let status = install().context("cannot run apt-get")?;
    if !status.success() {
        eprintln!("chorus bench: apt-get install failed; running apt-get update and trying again");
        let _ = Command::new("apt-get").args(["update", "-q"]).stdin(Stdio::null()).status();
        install().context("cannot run apt-get")?;
    }
    find_program(program, also)
        .with_context(|| format!("{program} still not found after installing {package}"))
}

/// First line a program prints for `--version`.
pub fn version(program: &Path) -> String {
    Command::new(program)
        .arg("--version")
        .output()
        .ok()
        .and_then(|out| String::from_utf8_lossy(&out.stdout).lines().next().map(str::to_string))
        .unwrap_or_default()
}

/// A scratch directory on /dev/shm (or the temp dir where there is none).
pub fn scratch_root() -> PathBuf {
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
    base.join(format!("chorus-bench-{}", std::process::id()))
}

#[cfg(test)]
mod command_line_tests {
    use super::*;

    #[test]
    fn the_report_gets_each_command_line_with_the_cluster_token_masked() {
        let dir = std::env::temp_dir().join(format!("chorus-bench-procs-test-{}", std::process::id()));
        let mut procs = Procs::new("test", dir.clone()).unwrap();
        let mut command = Command::new("true");
        command.args(["--cluster-token", "s3cret-token", "--port", "7"]);
        procs.spawn("node-0", command).unwrap();
        assert_eq!(
            procs.commands(),
            [("node-0".to_string(), "true --cluster-token <token> --port 7".to_string())]
        );
        drop(procs);
        let _ = std::fs::remove_dir_all(dir);
    }
}
