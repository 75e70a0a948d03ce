//! A small replicated table of bank accounts on the replicated-transaction API of HyperLoop §5,
//! run through real processes:
//!
//! ```text
//! cargo run -p chorus-group --example replicated_table                      # 3 members, chain
//! cargo run -p chorus-group --example replicated_table -- --members 5 --mode naive-polling
//! ```
//!
//! What it does:
//!
//! 1. starts `--members` group hosts as child processes (this same executable, re-run with
//!    `--serve-host`, which ends in `chorus_group::runtime::child_main`: exactly what
//!    `chorus group-host` runs), each with its own region directory, as if on separate machines;
//! 2. `Initialize`s a group whose region holds a lock word, a log head, a replicated
//!    write-ahead log and the table ([`TxnLayout`]);
//! 3. inserts `--rows` accounts and runs `--transfers` transfers. Every change is one redo
//!    record: `wr_lock` (gCAS on every member), `Append` (gWRITE + gFLUSH of the record into
//!    every member's log), `ExecuteAndAdvance` (gMEMCPY + gFLUSH per entry from the log into the
//!    table, then the log head by gWRITE + gFLUSH), `wr_unlock`. A transfer debits one row and
//!    credits another in the same record, so the total never changes at any member;
//! 4. reads the table lock-free at the head and at the tail, takes a read lock at the tail for
//!    a consistent snapshot, and opens every member's region file read-only (what a tenant's
//!    own process on a replica does) to check the members are byte-identical.
//!
//! Each row is 64 bytes: `balance u64 | name (56 bytes, zero padded)`, little-endian.
//! The table logic ([`Table`]) works on any [`GroupExecutor`]; `tests/replicated_table.rs`
//! runs this file's [`run`] against real processes.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use bytes::Bytes;
use chorus_group::runtime::TenantCredential;
use chorus_group::runtime::{
    spawn_child, BlockingGroupClient, ChildProcess, GroupSpec, HostConfig, HostMode,
};
use chorus_group::txn::{GroupExecutor, Txn, TxnError, TxnLayout};
use chorus_group::{GroupId, Token};
use chorus_region::{default_region_dir, RegionView, TenantId};

/// Bytes per row: a balance and a name.
pub const ROW_BYTES: u64 = 64;
const NAME_BYTES: usize = 56;
/// Attempts at the group write lock before giving up (another coordinator may hold it).
const LOCK_ATTEMPTS_MAX: usize = 100;

/// A table of accounts replicated on every member of one group.
pub struct Table<E: GroupExecutor> {
    txn: Txn<E>,
    rows: u64,
}

/// One account as read from one member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub balance: u64,
}

impl<E: GroupExecutor> Table<E> {
    /// The region layout for `rows` rows: a 16 KiB log, then the table.
    pub fn layout(rows: u64) -> TxnLayout {
        TxnLayout::new(16 * 1024, rows * ROW_BYTES)
    }

    /// `owner` (non-zero) names this coordinator in the write-lock word.
    pub fn new(executor: E, rows: u64, owner: u32) -> Table<E> {
        Table { txn: Txn::new(executor, Self::layout(rows), owner), rows }
    }

    pub fn txn(&self) -> &Txn<E> {
        &self.txn
    }

    fn row_offset(&self, row: u64) -> anyhow::Result<u64> {
        ensure!(row < self.rows, "row {row} is outside the {}-row table", self.rows);
        Ok(row * ROW_BYTES)
    }

    /// One transaction: take the group write lock, run `body` (which may read the head's table
    /// and returns the redo entries, or `None` to abort), make the record durable everywhere,
    /// apply it everywhere, release the lock.
    fn transaction<F>(&mut self, body: F) -> anyhow::Result<bool>
    where
        F: FnOnce(&mut Txn<E>) -> anyhow::Result<Option<Vec<(u64, Bytes)>>>,
    {
        let mut locked = false;
        for _ in 0..LOCK_ATTEMPTS_MAX {
            if self.txn.wr_lock()? {
                locked = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        ensure!(locked, "the group write lock stayed taken");
        let outcome = (|| {
            let Some(entries) = body(&mut self.txn)? else { return anyhow::Ok(false) };
            self.txn.append(&entries)?;
            while self.txn.execute_and_advance()?.is_some() {}
            anyhow::Ok(true)
        })();
        // Release the lock whatever happened, but report the first error.
        let unlocked = self.txn.wr_unlock();
        let committed = outcome?;
        unlocked?;
        Ok(committed)
    }

    /// Write a whole row.
    pub fn insert(&mut self, row: u64, name: &str, balance: u64) -> anyhow::Result<()> {
        let offset = self.row_offset(row)?;
        ensure!(name.len() <= NAME_BYTES, "a name is at most {NAME_BYTES} bytes");
        let mut bytes = vec![0u8; ROW_BYTES as usize];
        bytes[..8].copy_from_slice(&balance.to_le_bytes());
        bytes[8..8 + name.len()].copy_from_slice(name.as_bytes());
        self.transaction(|_| Ok(Some(vec![(offset, Bytes::from(bytes))])))?;
        Ok(())
    }

    /// Move `amount` from one row to another in one redo record. `Ok(false)`: not enough money
    /// (nothing written).
    pub fn transfer(&mut self, from: u64, to: u64, amount: u64) -> anyhow::Result<bool> {
        let (from_offset, to_offset) = (self.row_offset(from)?, self.row_offset(to)?);
        ensure!(from != to, "a transfer needs two rows");
        self.transaction(|txn| {
            // Under the write lock the head's table is current: read it there.
            let balance = |txn: &mut Txn<E>, offset| -> Result<u64, TxnError> {
                let bytes = txn.read(0, offset, 8)?;
                Ok(u64::from_le_bytes(bytes.try_into().expect("8 bytes")))
            };
            let (have, other) = (balance(txn, from_offset)?, balance(txn, to_offset)?);
            if have < amount {
                return Ok(None);
            }
            let credited = other.checked_add(amount).context("balance overflow")?;
            Ok(Some(vec![
                (from_offset, Bytes::from((have - amount).to_le_bytes().to_vec())),
                (to_offset, Bytes::from(credited.to_le_bytes().to_vec())),
            ]))
        })
    }

    /// Lock-free read of one row at the member at `position` (0: head, last: tail).
    pub fn get(&mut self, position: usize, row: u64) -> anyhow::Result<Account> {
        let offset = self.row_offset(row)?;
        Ok(decode_row(&self.txn.read(position, offset, ROW_BYTES)?))
    }

    /// Every row at the member at `position`, under a read lock there (no writer can commit
    /// in between, so the snapshot is consistent).
    pub fn snapshot(&mut self, position: usize) -> anyhow::Result<Vec<Account>> {
        let mut locked = false;
        for _ in 0..LOCK_ATTEMPTS_MAX {
            if self.txn.rd_lock(position)? {
                locked = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        ensure!(locked, "member {position} stayed write-locked");
        let rows = (0..self.rows).map(|row| self.get(position, row)).collect::<anyhow::Result<Vec<_>>>();
        self.txn.rd_unlock(position)?;
        rows
    }
}

pub fn decode_row(bytes: &[u8]) -> Account {
    let balance = u64::from_le_bytes(bytes[..8].try_into().expect("a row has a balance"));
    let name = bytes[8..].iter().take_while(|b| **b != 0).map(|b| *b as char).collect();
    Account { name, balance }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Program and arguments that start a group host process (ending in `child_main`).
    pub host_command: Vec<String>,
    pub members: usize,
    pub mode: HostMode,
    pub rows: u64,
    pub transfers: u64,
    /// Where the hosts' region directories go (a fresh subdirectory, removed at the end).
    pub region_dir: PathBuf,
}

/// What a run found.
#[derive(Clone, Debug)]
pub struct Summary {
    pub committed: u64,
    pub refused: u64,
    /// The table at every member, read through a read lock.
    pub tables: Vec<Vec<Account>>,
    /// Each member's region file, as the tenant's process on that replica maps it.
    pub region_files: Vec<Vec<u8>>,
    /// Where each member's operations were served (a Naïve replica, or the host itself).
    pub data_addrs: Vec<SocketAddr>,
    pub host_addrs: Vec<SocketAddr>,
}

const TENANT: TenantId = TenantId(42);
const TOKEN: Token = Token(*b"replicated-table");
const STARTING_BALANCE: u64 = 1000;

/// Start the hosts, build the table, run the transfers, read everything back.
pub fn run(options: &Options) -> anyhow::Result<Summary> {
    ensure!(options.rows >= 2, "a table of accounts needs two rows");
    let dir = options.region_dir.join(format!("replicated-table-{}", std::process::id()));
    let result = run_in(options, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn run_in(options: &Options, dir: &std::path::Path) -> anyhow::Result<Summary> {
    // The hosts' processes are children of this runtime; it outlives the client.
    let processes = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let mut hosts: Vec<ChildProcess> = Vec::new();
    let mut host_addrs = Vec::new();
    for i in 0..options.members {
        let mut config = HostConfig::new(
            "127.0.0.1:0".parse()?,
            dir.join(format!("host{i}")),
            vec![TenantCredential::new(TENANT, &TOKEN)],
        );
        config.mode = options.mode;
        config.replica_command = Some(options.host_command.clone());
        config.worker_threads = 1;
        let (addr, child) = processes
            .block_on(spawn_child(&options.host_command, &config, Duration::from_secs(10)))
            .with_context(|| format!("starting host {i}"))?;
        hosts.push(child);
        host_addrs.push(addr);
    }
    let layout = Table::<BlockingGroupClient>::layout(options.rows);
    let spec =
        GroupSpec::new(host_addrs.clone(), TENANT, TOKEN, GroupId(1), "accounts", layout.region_bytes());
    let client = BlockingGroupClient::initialize(spec).context("initializing the group")?;
    let region_paths = client.client().region_paths().to_vec();
    let data_addrs = client.client().data_addrs().to_vec();
    let mut table = Table::new(client, options.rows, 1);

    for row in 0..options.rows {
        table.insert(row, &format!("account-{row:03}"), STARTING_BALANCE)?;
    }
    let (mut committed, mut refused) = (0, 0);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |bound: u64| {
        // xorshift64: deterministic transfers, no dependency.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % bound
    };
    for _ in 0..options.transfers {
        let from = next(options.rows);
        let to = (from + 1 + next(options.rows - 1)) % options.rows;
        let amount = next(STARTING_BALANCE * 2);
        if table.transfer(from, to, amount)? {
            committed += 1;
        } else {
            refused += 1;
        }
    }
    let tail = options.members - 1;
    let head_row = table.get(0, 0)?;
    let tail_row = table.get(tail, 0)?;
    ensure!(head_row == tail_row, "lock-free reads at head and tail differ: {head_row:?} vs {tail_row:?}");
    let tables = (0..options.members).map(|m| table.snapshot(m)).collect::<anyhow::Result<Vec<_>>>()?;
    let region_files = region_paths
        .iter()
        .map(|path| {
            let view = RegionView::open(path)?;
            anyhow::Ok(view.read_vec(0, view.size())?)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    drop(table);
    drop(hosts);
    Ok(Summary { committed, refused, tables, region_files, data_addrs, host_addrs })
}

#[allow(dead_code)] // the test includes this file and runs `run` only
fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--serve-host") {
        return chorus_group::runtime::child_main();
    }
    let exe = std::env::current_exe()?.display().to_string();
    let mut options = Options {
        host_command: vec![exe, "--serve-host".to_string()],
        members: 3,
        mode: HostMode::Chorus,
        rows: 16,
        transfers: 200,
        region_dir: default_region_dir(),
    };
    let mut args = args.into_iter();
    while let Some(flag) = args.next() {
        let mut value = || args.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--members" => options.members = value()?.parse()?,
            "--rows" => options.rows = value()?.parse()?,
            "--transfers" => options.transfers = value()?.parse()?,
            "--region-dir" => options.region_dir = value()?.into(),
            "--mode" => options.mode = value()?.parse().map_err(anyhow::Error::msg)?,
            other => bail!(
                "unknown argument {other:?}; usage: replicated_table [--members N] [--rows N] \
                 [--transfers N] [--mode chorus|naive|naive-polling] [--region-dir DIR]"
            ),
        }
    }
    ensure!((1..=64).contains(&options.members), "--members is 1 to 64");
    let summary = run(&options)?;
    println!(
        "{} members ({:?}) at {:?}, served at {:?}",
        options.members, options.mode, summary.host_addrs, summary.data_addrs
    );
    println!("{} transfers committed, {} refused (not enough money)", summary.committed, summary.refused);
    for (position, table) in summary.tables.iter().enumerate() {
        let total: u64 = table.iter().map(|a| a.balance).sum();
        let first: Vec<String> = table.iter().take(4).map(|a| format!("{}={}", a.name, a.balance)).collect();
        println!("member {position}: total {total}, {} ...", first.join(" "));
    }
    let expected_total = STARTING_BALANCE * options.rows;
    ensure!(
        summary.tables.iter().all(|t| t.iter().map(|a| a.balance).sum::<u64>() == expected_total),
        "a member's total is not {expected_total}"
    );
    ensure!(summary.region_files.windows(2).all(|w| w[0] == w[1]), "the members' region files differ");
    println!("every member's region file is byte-identical; the total is {expected_total} everywhere");
    Ok(())
}
