//! `chorus up` keeps a cluster (issue 24 point 4): its default directory survives a reboot,
//! and `chorus up` on a directory that holds a cluster restarts that cluster, keys included.

use support::scratch::Scratch;
use support::up::{client, free_port_run, Up};

mod support;

#[test]
fn chorus_up_on_its_directory_restarts_the_same_cluster_with_its_keys() {
    let scratch = Scratch::new("up-restart");
    let port = free_port_run(6, 0);
    // The default directory is under XDG_DATA_HOME (else ~/.local/share), per port.
    let (up, first) = Up::start(port, 3, &[], &[("XDG_DATA_HOME", &scratch.0)]).unwrap();
    let dir = scratch.0.join("chorus").join(format!("up-{port}"));
    assert!(first.contains(&dir.display().to_string()), "{first}");
    assert!(first.contains("data kept across restarts"), "{first}");
    for i in 0..30u16 {
        let mut con = client(port + i % 3);
        let _: () = redis::cmd("SET").arg(format!("k:{i}")).arg(format!("v:{i}")).query(&mut con).unwrap();
    }
    up.stop();

    let (up, first) = Up::start(port, 3, &["--data-dir", dir.to_str().unwrap()], &[]).unwrap();
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
    let error = Up::start(port, 3, &["--data-dir", dir.to_str().unwrap(), "--protocol", "craq"], &[])
        .err()
        .expect("chorus up must refuse another protocol on this directory");
    assert!(error.contains("holds a 1-shard 3-replica hermes cluster"), "{error}");
}

#[test]
fn chorus_up_in_memory_keeps_nothing() {
    let port = free_port_run(6, 1);
    let (up, first) = Up::start(port, 3, &["--in-memory"], &[]).unwrap();
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
/// does not fit with a clear error. Issue 24: the chain keeps its keys across a `chorus up`
/// restart (appendonly yes by default), at every replica alike; the shape is part of the
/// data, so a restart with another shape is refused, saying so.
#[test]
fn chorus_up_chain_with_the_kernel_shape_maps_one_mib_regions() {
    let scratch = Scratch::new("up-chain-shape");
    let port = free_port_run(6, 2);
    let dir = scratch.0.join("cluster");
    let args = ["--protocol", "chain", "--chain-shape", "kernel", "--data-dir", dir.to_str().unwrap()];
    let (up, _) = Up::start(port, 3, &args, &[]).unwrap();
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

    let (up, first) = Up::start(port, 3, &args, &[]).expect("the chain restarts on its regions");
    assert!(first.contains("restarted from the data kept"), "{first}");
    for node in 0..3 {
        let value: Option<String> = redis::cmd("GET").arg("k").query(&mut client(port + node)).unwrap();
        assert_eq!(value.as_deref(), Some("v"), "replica {node} kept the key");
    }
    up.stop();
    let error = Up::start(port, 3, &["--protocol", "chain", "--data-dir", dir.to_str().unwrap()], &[])
        .err()
        .expect("a restart with the server shape over kernel-shape regions is refused");
    assert!(error.contains("1048576 bytes"), "{error}");
    let error =
        Up::start(port, 3, &["--chain-shape", "kernel"], &[]).err().expect("hermes has no chain shape");
    assert!(error.contains("only applies to --protocol chain"), "{error}");
}
