//! Reads racing writes of one key whose every value is self-checking: value `i` is
//! `VALUE_BYTES` copies of one byte that names `i`, so a read that returns anything but one
//! whole value that was written (a mixture of two, a short one, an error such as "the chain
//! region is corrupt") is caught by looking at it alone.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::up::{client, wait_for_value};

/// Larger than a kernel datagram's 1 KiB chunk, so that on the kernel path every execute of
/// the key is a gMEMCPY split across several datagrams (several softirq runs).
pub const VALUE_BYTES: usize = 4000;
/// SETs sent per round trip: a batch of several executes of the key per record.
const WRITE_PIPELINE: usize = 16;
/// GETs sent per round trip.
const PIPELINE: usize = 4;

/// Value number `i`.
pub fn value(i: u64) -> Vec<u8> {
    vec![b'A' + (i % 26) as u8; VALUE_BYTES]
}

/// What the reads saw.
#[derive(Debug, Default)]
pub struct Reads {
    pub total: u64,
    /// The reads that were not one whole written value.
    pub bad: u64,
    /// Some of them, described.
    pub examples: Vec<String>,
}

fn judge(reply: &redis::RedisResult<Option<Vec<u8>>>) -> Option<String> {
    match reply {
        Ok(Some(v))
            if v.len() == VALUE_BYTES && v.iter().all(|b| *b == v[0]) && v[0].is_ascii_uppercase() =>
        {
            None
        }
        Ok(Some(v)) => {
            let kinds: std::collections::BTreeSet<u8> = v.iter().copied().collect();
            Some(format!(
                "torn: {} bytes of {:?}",
                v.len(),
                kinds.iter().map(|b| *b as char).collect::<String>()
            ))
        }
        Ok(None) => Some("absent".into()),
        Err(error) => Some(format!("error: {error}")),
    }
}

/// For `race_for`: SET `key` at `writer_port` to value 1, 2, 3, ... (pipelined) while
/// `readers` clients GET it at `reader_port`; every read is judged. The key must hold a value
/// already (every read must find one).
pub fn race(writer_port: u16, reader_port: u16, key: &str, readers: usize, race_for: Duration) -> Reads {
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, key) = (stop.clone(), key.to_string());
        thread::spawn(move || {
            let mut con = client(writer_port);
            let mut i = 1;
            while !stop.load(Ordering::Relaxed) {
                let mut pipe = redis::pipe();
                for _ in 0..WRITE_PIPELINE {
                    pipe.cmd("SET").arg(&key).arg(value(i)).ignore();
                    i += 1;
                }
                pipe.query::<()>(&mut con).expect("SET");
            }
            i
        })
    };
    let readers: Vec<_> = (0..readers)
        .map(|_| {
            let (stop, key) = (stop.clone(), key.to_string());
            thread::spawn(move || {
                let mut con = client(reader_port);
                let mut reads = Reads::default();
                while !stop.load(Ordering::Relaxed) {
                    let mut pipe = redis::pipe();
                    for _ in 0..PIPELINE {
                        pipe.cmd("GET").arg(&key);
                    }
                    // Replies are judged one by one (an error reply among them included).
                    let replies: Vec<redis::Value> = match pipe.query(&mut con) {
                        Ok(replies) => replies,
                        Err(error) => {
                            reads.total += PIPELINE as u64;
                            reads.bad += 1;
                            if reads.examples.len() < 10 {
                                reads.examples.push(format!("pipeline failed: {error}"));
                            }
                            continue;
                        }
                    };
                    for reply in replies {
                        let reply = redis::from_redis_value::<Option<Vec<u8>>>(&reply);
                        reads.total += 1;
                        if let Some(what) = judge(&reply) {
                            reads.bad += 1;
                            if reads.examples.len() < 10 {
                                reads.examples.push(what);
                            }
                        }
                    }
                }
                reads
            })
        })
        .collect();
    let started = Instant::now();
    thread::sleep(race_for);
    stop.store(true, Ordering::Relaxed);
    let written = writer.join().unwrap();
    let mut all = Reads::default();
    for reader in readers {
        let reads = reader.join().unwrap();
        all.total += reads.total;
        all.bad += reads.bad;
        all.examples.extend(reads.examples);
        all.examples.truncate(10);
    }
    eprintln!(
        "{} reads at {reader_port} racing {written} writes at {writer_port} for {:?}: {} not a whole written value",
        all.total,
        started.elapsed(),
        all.bad
    );
    all
}

/// Node `port`'s INFO line `name` as a number (0 if absent).
pub fn info_counter(port: u16, name: &str) -> u64 {
    let info: String = redis::cmd("INFO").query(&mut client(port)).unwrap();
    let prefix = format!("{name}:");
    info.lines().find_map(|line| line.strip_prefix(&prefix)).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

/// The chain's tail among the nodes on `ports`: the one whose `chain_reads_tail` counts a GET
/// (which node that is depends on the views so far).
pub fn chain_tail(ports: &[u16], key: &str) -> u16 {
    for port in ports {
        let before = info_counter(*port, "chain_reads_tail");
        let _: Option<Vec<u8>> = redis::cmd("GET").arg(key).query(&mut client(*port)).unwrap();
        if info_counter(*port, "chain_reads_tail") > before {
            return *port;
        }
    }
    panic!("no node among {ports:?} served a read as the tail");
}

/// On a 3-node chain started from `port` (`Up::hosted_chain`): `readers` threads read key
/// "racy" at its tail while a writer at another node overwrites it for 3 s; every read must
/// be one whole value that was written, and served as the tail's (`chain_reads_tail`).
pub fn assert_tail_reads_are_whole(port: u16, readers: usize) {
    let _: () = redis::cmd("SET").arg("racy").arg(value(0)).query(&mut client(port)).unwrap();
    wait_for_value(port + 2, "racy", std::str::from_utf8(&value(0)).unwrap());
    let tail = chain_tail(&[port, port + 1, port + 2], "racy");
    let head = if tail == port { port + 1 } else { port };
    let before = info_counter(tail, "chain_reads_tail");
    let reads = race(head, tail, "racy", readers, Duration::from_secs(3));
    let at_tail = info_counter(tail, "chain_reads_tail") - before;
    assert!(at_tail >= reads.total, "{at_tail} of {} reads were served as the tail's", reads.total);
    assert_eq!(
        reads.bad, 0,
        "{} of {} tail reads were not a whole written value: {:?}",
        reads.bad, reads.total, reads.examples
    );
}
