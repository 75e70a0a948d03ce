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
