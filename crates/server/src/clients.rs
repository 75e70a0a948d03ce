//! The node's client registry: what CLIENT LIST shows and CLIENT KILL acts on. Each
//! connection registers when it starts and leaves when it ends; a kill removes the entry at
//! once (the killed client is gone from CLIENT LIST when the KILL is answered) and wakes the
//! connection's task, which closes the socket. Connections are per node: CLIENT LIST and
//! CLIENT KILL see the clients of the node they are sent to, as Redis does per server.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::Notify;

use crate::pubsub::Mailbox;

/// One connected client as CLIENT LIST shows it.
#[derive(Clone, Debug)]
pub struct ClientInfo {
    pub id: u64,
    pub addr: SocketAddr,
    pub laddr: SocketAddr,
    pub name: Option<Bytes>,
    pub resp: u8,
    pub connected: Instant,
    /// Woken when another client kills this one.
    pub kill: Arc<Notify>,
    /// The command it runs or ran last, by its index in the command table.
    pub last_command: Arc<AtomicUsize>,
    /// Its Pub/Sub mailbox, once it (un)subscribed: how many subscriptions it has.
    pub pubsub: Option<Arc<Mailbox>>,
}

impl ClientInfo {
    /// Redis' client type: `pubsub` while subscribed to anything, else `normal`.
    pub fn kind(&self) -> &'static str {
        match &self.pubsub {
            Some(mailbox) if mailbox.subscribed() => "pubsub",
            _ => "normal",
        }
    }

    /// [channels, patterns, shard channels] it is subscribed to.
    pub fn subscriptions(&self) -> [usize; 3] {
        self.pubsub.as_ref().map_or([0; 3], |mailbox| mailbox.counts())
    }

    /// The name of the command it runs or ran last (`NULL` before its first, as Redis).
    pub fn last_command(&self) -> &'static str {
        crate::command::COMMAND_TABLE.get(self.last_command.load(Relaxed)).map_or("NULL", |spec| spec.name)
    }
}

#[derive(Default)]
pub struct Registry {
    clients: Mutex<BTreeMap<u64, ClientInfo>>,
}

/// CLIENT KILL's filters (`ID`, `ADDR`, `LADDR`, `USER`, `SKIPME`, `MAXAGE`); every given one
/// must match.
#[derive(Default, Debug)]
pub struct KillFilter {
    pub id: Option<u64>,
    pub addr: Option<String>,
    pub laddr: Option<String>,
    pub user: Option<String>,
    pub max_age_s: Option<u64>,
    /// The calling client is spared (the default).
    pub skip_me: bool,
    /// `TYPE normal` or `TYPE pubsub` ([`ClientInfo::kind`]).
    pub kind: Option<&'static str>,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, ClientInfo>> {
        // A panic while holding the lock cannot leave the map half-changed: every change is
        // one insert or remove.
        self.clients.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn register(&self, info: ClientInfo) {
        self.lock().insert(info.id, info);
    }

    pub fn deregister(&self, id: u64) {
        self.lock().remove(&id);
    }

    pub fn update(&self, id: u64, change: impl FnOnce(&mut ClientInfo)) {
        if let Some(info) = self.lock().get_mut(&id) {
            change(info);
        }
    }

    pub fn get(&self, id: u64) -> Option<ClientInfo> {
        self.lock().get(&id).cloned()
    }

    /// Every client, by id; only `ids` if given.
    pub fn list(&self, ids: Option<&[u64]>) -> Vec<ClientInfo> {
        let clients = self.lock();
        match ids {
            None => clients.values().cloned().collect(),
            Some(ids) => ids.iter().filter_map(|id| clients.get(id).cloned()).collect(),
        }
    }

    /// Remove the clients `filter` matches (`me` is the caller) and wake their tasks; how many.
    pub fn kill(&self, filter: &KillFilter, me: u64) -> usize {
        let mut clients = self.lock();
        let doomed: Vec<u64> =
            clients.values().filter(|client| filter.matches(client, me)).map(|client| client.id).collect();
        for id in &doomed {
            if let Some(client) = clients.remove(id) {
                client.kill.notify_one();
            }
        }
        doomed.len()
    }
}

impl KillFilter {
    fn matches(&self, client: &ClientInfo, me: u64) -> bool {
        (!self.skip_me || client.id != me)
            && self.id.is_none_or(|id| id == client.id)
            && self.addr.as_ref().is_none_or(|addr| *addr == client.addr.to_string())
            && self.laddr.as_ref().is_none_or(|laddr| *laddr == client.laddr.to_string())
            // Chorus has one user.
            && self.user.as_ref().is_none_or(|user| user == "default")
            && self.max_age_s.is_none_or(|age| client.connected.elapsed().as_secs() >= age)
            && self.kind.is_none_or(|kind| kind == client.kind())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(id: u64, port: u16) -> ClientInfo {
        ClientInfo {
            id,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            laddr: SocketAddr::from(([127, 0, 0, 1], 6379)),
            name: None,
            resp: 2,
            connected: Instant::now(),
            kill: Arc::new(Notify::new()),
            last_command: Arc::new(AtomicUsize::new(usize::MAX)),
            pubsub: None,
        }
    }

    #[test]
    fn a_kill_removes_the_matching_clients_but_the_caller_and_wakes_them() {
        let registry = Registry::default();
        for (id, port) in [(1, 5001), (2, 5002), (3, 5003)] {
            registry.register(client(id, port));
        }
        let woken = registry.get(2).expect("registered").kill;
        let by_addr =
            KillFilter { addr: Some("127.0.0.1:5002".into()), skip_me: true, ..KillFilter::default() };
        assert_eq!(registry.kill(&by_addr, 1), 1);
        assert_eq!(registry.list(None).iter().map(|c| c.id).collect::<Vec<_>>(), [1, 3]);
        // The woken task sees the notification even though it was sent before it waited.
        let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        runtime.block_on(woken.notified());

        let everyone =
            KillFilter { laddr: Some("127.0.0.1:6379".into()), skip_me: true, ..KillFilter::default() };
        assert_eq!(registry.kill(&everyone, 1), 1, "the caller is skipped");
        assert_eq!(registry.list(Some(&[1, 3])).len(), 1);
    }
}
