//! Accepting clients: admission against `maxclients`, socket options, and the hand-off to a
//! [`Connection`]. The connection is generic over its stream, so an acceptor that wraps the
//! TCP stream first (TLS) reuses everything here through [`accept_loop`]'s `upgrade`.

use std::future::Future;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, warn};

use crate::connection::{Addresses, Connection, Shared};

/// What a refused client reads before the connection closes (Redis' wording).
const MAXCLIENTS_REPLY: &[u8] = b"-ERR max number of clients reached\r\n";

/// One admitted client: counts in `connected_clients` until dropped.
pub struct ClientSlot {
    shared: Arc<Shared>,
}

impl ClientSlot {
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        self.shared.metrics.connections_current.fetch_sub(1, Relaxed);
    }
}

/// Admit `stream` if fewer than `maxclients` clients are connected; otherwise answer it
/// `-ERR max number of clients reached` and let it close. The refusal is written without
/// waiting (a fresh socket's send buffer always takes 36 bytes), so a flood of refused
/// connections holds no descriptor past this call.
pub fn admit(shared: &Arc<Shared>, stream: &TcpStream) -> Option<ClientSlot> {
    let metrics = &shared.metrics;
    metrics.connections_accepted.fetch_add(1, Relaxed);
    let current = metrics.connections_current.fetch_add(1, Relaxed);
    if current >= shared.live.maxclients.load(Relaxed) {
        metrics.connections_current.fetch_sub(1, Relaxed);
        metrics.connections_rejected.fetch_add(1, Relaxed);
        let _ = stream.try_write(MAXCLIENTS_REPLY);
        return None;
    }
    Some(ClientSlot { shared: shared.clone() })
}

/// Socket options for a client connection: no Nagle delay (replies are already batched per
/// pipeline) and TCP keepalive (`tcp-keepalive`, as Redis: probes after that many idle
/// seconds, then every third of it, three of them), so a client whose host vanished is
/// noticed even when the connection is idle.
pub fn configure_socket(stream: &TcpStream, keepalive_s: u64) {
    let _ = stream.set_nodelay(true);
    if keepalive_s == 0 {
        return;
    }
    let idle = Duration::from_secs(keepalive_s);
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(idle)
        .with_interval(Duration::from_secs((keepalive_s / 3).max(1)))
        .with_retries(3);
    if let Err(error) = socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive) {
        debug!("cannot set TCP keepalive on a client connection: {error}");
    }
}

/// Serve one admitted client on `stream` (plain TCP, or TLS over it) until it leaves.
pub async fn serve<S>(slot: ClientSlot, stream: S, addresses: Addresses)
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    Connection::new(slot.shared.clone(), stream, addresses).run().await;
    drop(slot);
}

/// Accept clients on `listener` forever: admit, set socket options, `upgrade` the TCP
/// stream (the identity for plain RESP, a TLS handshake for a TLS port), serve. Dropping
/// the future stops accepting; connections already served continue. With `to_reactor` (plain
/// RESP) a client goes to the node's reactor when it runs one (crate::reactor).
pub async fn accept_loop<S, F, Fut>(listener: TcpListener, shared: Arc<Shared>, upgrade: F, to_reactor: bool)
where
    F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = std::io::Result<S>> + Send + 'static,
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Typically out of descriptors: back off instead of spinning.
                warn!("accepting client connections failed: {error}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(slot) = admit(&shared, &stream) else { continue };
        configure_socket(&stream, shared.settings.clients.tcp_keepalive_s);
        let local = stream.local_addr().unwrap_or(shared.settings.client_addr);
        let addresses = Addresses { peer, local };
        // A client that must AUTH first starts on a connection task, which checks it; the
        // reactor serves only clients that are authenticated from the start (no password).
        if let Some(door) = shared.reactor.get().filter(|_| to_reactor && shared.live.user().open()) {
            if let Err(error) = door.enter(shared.clone(), slot, stream, addresses) {
                debug!("client connection not served: {error}");
            }
            continue;
        }
        let upgraded = upgrade(stream);
        tokio::spawn(async move {
            match upgraded.await {
                Ok(stream) => serve(slot, stream, addresses).await,
                Err(error) => debug!("client connection failed before serving: {error}"),
            }
        });
    }
}

/// Plain RESP over TCP: [`accept_loop`]'s `upgrade` for the client port.
pub async fn plain(stream: TcpStream) -> std::io::Result<TcpStream> {
    Ok(stream)
}
