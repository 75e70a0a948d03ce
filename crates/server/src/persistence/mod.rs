//! Persistence in the node: the append-only file and snapshots (crate `chorus-persistence`,
//! shared with the simulator), the served cores' view of it, and the commands and `INFO`
//! fields that expose it.

pub use chorus_persistence::*;

use chorus_core::Key;

use crate::engine::ServedReplica;

/// A served core as the append-only file sees it (its `Durable` answers are the
/// [`ServedReplica`] methods of the same names).
pub struct Served<'a, R>(pub &'a R);

impl<R: ServedReplica> Durable for Served<'_, R>
where
    R::Message: chorus_core::codec::WireMessage + Send + 'static,
{
    fn durable_record(&self, keys: &[Key]) -> Option<Vec<u8>> {
        self.0.durable_record(keys)
    }
    fn durable_keys(&self) -> Vec<Key> {
        self.0.durable_keys()
    }
    fn holds_all_data(&self) -> bool {
        self.0.holds_all_data()
    }
    fn snapshot_header(&self) -> Vec<Vec<u8>> {
        self.0.snapshot_header()
    }
    fn snapshot_record(&self, keys: &[Key]) -> Option<Vec<u8>> {
        self.0.snapshot_record(keys)
    }
}

/// `BGSAVE [SCHEDULE]`, `BGREWRITEAOF`, `LASTSAVE`, answered as Redis does.
pub async fn command(engine: &crate::engine::EngineHandle, args: &[bytes::Bytes]) -> crate::resp::Reply {
    use crate::resp::Reply;
    let name = String::from_utf8_lossy(&args[0]).to_ascii_uppercase();
    let save = name != "LASTSAVE";
    match engine.persistence(save).await {
        None if save => Reply::err("appendonly is off: this node persists nothing (set appendonly yes)"),
        // Without persistence the last "save" is never: Redis answers its start time then.
        None => Reply::Integer(crate::command::wall_clock_ms() as i64 / 1000),
        Some(Err(error)) => Reply::err(error),
        Some(Ok(_)) if name == "BGSAVE" => Reply::text("Background saving started"),
        Some(Ok(_)) if name == "BGREWRITEAOF" => Reply::text("Background append only file rewriting started"),
        Some(Ok(info)) => Reply::Integer(info.last_save_unix as i64),
    }
}

/// The `INFO persistence` fields: Redis' names, then Chorus' own.
pub fn info_fields(info: Option<&PersistenceInfo>) -> Vec<(&'static str, String)> {
    let Some(info) = info else {
        return vec![
            ("loading", "0".into()),
            ("rdb_changes_since_last_save", "0".into()),
            ("rdb_bgsave_in_progress", "0".into()),
            ("rdb_last_bgsave_status", "ok".into()),
            ("aof_enabled", "0".into()),
            ("aof_rewrite_in_progress", "0".into()),
        ];
    };
    let status = |ok: bool| if ok { "ok" } else { "err" }.to_string();
    vec![
        ("loading", "0".into()),
        ("rdb_changes_since_last_save", info.changes_since_last_save.to_string()),
        ("rdb_bgsave_in_progress", (info.bgsave_in_progress as u8).to_string()),
        ("rdb_last_save_time", info.last_save_unix.to_string()),
        ("rdb_last_bgsave_status", status(info.last_bgsave_ok)),
        ("rdb_saves", info.snapshots.to_string()),
        ("aof_enabled", "1".into()),
        ("aof_rewrite_in_progress", (info.bgsave_in_progress as u8).to_string()),
        ("aof_rewrites", info.snapshots.to_string()),
        ("aof_last_write_status", status(info.last_write_ok)),
        ("aof_current_size", (info.incr_bytes + info.base_bytes).to_string()),
        ("aof_base_size", info.base_bytes.to_string()),
        ("chorus_appendfsync", info.appendfsync.to_string()),
        ("chorus_aof_dir", info.dir.clone()),
        ("chorus_aof_records", info.records_appended.to_string()),
        ("chorus_aof_syncs", info.syncs.to_string()),
        ("chorus_aof_records_restored", info.restored_records.to_string()),
    ]
}
