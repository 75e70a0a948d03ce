//! Group hosts and Naïve replicas as child processes.
//!
//! Protocol between parent and child: the parent writes one line of JSON (a
//! [`HostConfig`]) to the child's stdin and keeps stdin open; the child starts the host and
//! prints exactly one line, `LISTENING <addr>`, on stdout; it serves until its stdin closes
//! (the parent exited or dropped it: no orphans) or, with `exit_when_idle`, until its group's
//! caller has gone. Logs go to stderr.

use std::io::{BufRead, Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};

use super::host::{start_host, HostConfig};

/// A running child; dropping it kills the process (and closes its stdin).
pub struct ChildProcess {
    child: Child,
    _stdin: ChildStdin,
}

impl ChildProcess {
    pub fn id(&self) -> Option<u32> {
        self.child.id()
    }
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
    /// Kill the process now (a crash, as far as its peers can tell) and reap it.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }
}

/// Start `command` (program and arguments ending in [`child_main`]) as a group host with
/// `config`, and wait (at most `timeout`) for the address it listens on.
pub async fn spawn_child(
    command: &[String],
    config: &HostConfig,
    timeout: Duration,
) -> anyhow::Result<(SocketAddr, ChildProcess)> {
    let (program, args) = command.split_first().context("empty child command")?;
    let mut child = Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {program}"))?;
    let mut stdin = child.stdin.take().context("child stdin")?;
    let stdout = child.stdout.take().context("child stdout")?;
    let mut line = serde_json::to_string(config)?;
    line.push('\n');
    let handshake = async {
        stdin.write_all(line.as_bytes()).await?;
        stdin.flush().await?;
        let mut lines = BufReader::new(stdout).lines();
        let first = lines.next_line().await?.context("the child exited before listening")?;
        let addr = first
            .strip_prefix("LISTENING ")
            .with_context(|| format!("unexpected first line from the child: {first:?}"))?
            .trim()
            .parse::<SocketAddr>()?;
        anyhow::Ok(addr)
    };
    let addr = match tokio::time::timeout(timeout, handshake).await {
        Ok(Ok(addr)) => addr,
        Ok(Err(error)) => return Err(error.context(format!("starting child {program}"))),
        Err(_) => anyhow::bail!("child {program} did not report its address within {timeout:?}"),
    };
    Ok((addr, ChildProcess { child, _stdin: stdin }))
}

/// The child side: read a [`HostConfig`] from stdin, run the host, print `LISTENING <addr>`,
/// serve until stdin closes (or the replica is idle). Blocking; builds its own runtime.
/// What `chorus group-child` (and this crate's `chorus-group-child` binary) call.
pub fn child_main() -> anyhow::Result<()> {
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).context("reading the host configuration from stdin")?;
    let config: HostConfig = serde_json::from_str(line.trim()).context("parsing the host configuration")?;
    let runtime = super::host::build_runtime(&config)?;
    let busy_poll = config.busy_poll;
    // stdin closing (the parent is gone) ends the child. A plain thread, so a blocked read
    // never holds up the runtime's shutdown.
    let (closed_tx, closed_rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let mut sink = [0u8; 256];
        let mut stdin = std::io::stdin().lock();
        while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
        let _ = closed_tx.send(());
    });
    let result = runtime.block_on(async move {
        if busy_poll {
            super::host::spawn_spinner();
        }
        let handle = start_host(config).await?;
        {
            let mut stdout = std::io::stdout().lock();
            writeln!(stdout, "LISTENING {}", handle.local_addr())?;
            stdout.flush()?;
        }
        tokio::select! {
            _ = closed_rx => {}
            _ = handle.idle() => {}
        }
        handle.shutdown();
        anyhow::Ok(())
    });
    runtime.shutdown_background();
    result
}
