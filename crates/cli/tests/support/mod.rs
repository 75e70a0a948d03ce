//! Helpers shared by the process-level tests.

#![allow(dead_code)] // Each test file uses a different part.

pub mod loopback;
pub mod netns;
pub mod scratch;
pub mod torn;
pub mod up;
pub mod workload;

/// `line` (words separated by single spaces) sent as one command; panics with the line on
/// an error reply.
pub fn query<T: redis::FromRedisValue>(con: &mut redis::Connection, line: &str) -> T {
    command(line).query(con).unwrap_or_else(|error| panic!("{line}: {error}"))
}

/// The error `line` answers; panics if it answers anything else.
pub fn error_of(con: &mut redis::Connection, line: &str) -> String {
    match command(line).query::<redis::Value>(con) {
        Err(error) => error.to_string(),
        Ok(value) => panic!("{line}: expected an error, got {value:?}"),
    }
}

/// Send `signal` to process `pid`. A SIGSTOP returns only once every thread of the process
/// has stopped: kill(2) wakes one thread, which then stops the rest, so under load the others
/// (a node's event loop among them) could go on answering peers for milliseconds after kill
/// returned, and a test that freezes a node and then writes would race it.
pub fn send_signal(pid: libc::pid_t, signal: libc::c_int) {
    // SAFETY: kill(2) with a pid the test owns; no memory is involved.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "kill({pid}, {signal})");
    if signal != libc::SIGSTOP {
        return;
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !every_thread_stopped(pid) {
        assert!(std::time::Instant::now() < deadline, "process {pid} did not stop within 10 s of SIGSTOP");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Whether every thread of `pid` is stopped (state `T` in /proc/<pid>/task/<tid>/stat).
fn every_thread_stopped(pid: libc::pid_t) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    tasks.filter_map(Result::ok).all(|task| {
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // The state follows the command name's closing parenthesis.
        stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T') || rest.starts_with('t'))
    })
}

/// Kill `children` and wait for them; then remove `dir`, unless the test is failing: its logs
/// are kept then, and named.
pub fn stop_processes(children: impl IntoIterator<Item = std::process::Child>, dir: &std::path::Path) {
    for mut child in children {
        let _ = child.kill();
        let _ = child.wait();
    }
    if std::thread::panicking() {
        eprintln!("node logs kept in {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(dir);
    }
}

fn command(line: &str) -> redis::Cmd {
    let mut words = line.split(' ');
    let mut cmd = redis::cmd(words.next().expect("a command"));
    for arg in words {
        cmd.arg(arg);
    }
    cmd
}
