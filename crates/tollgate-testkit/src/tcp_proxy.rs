//! A TCP proxy in front of one server on 127.0.0.1, for the failover
//! tests: every client of a Redis master (its replica and the Sentinels
//! included) reaches it through the proxy, which on command cuts the
//! replication stream alone. What the master sends on a connection that
//! asked for `PSYNC` (or `SYNC`) is then dropped, as a partition between
//! master and replica would drop it, while every other client is still
//! answered and the replica's own reports still reach the master.
//!
//! A connection whose server cannot be reached (it was killed) is closed at
//! once, and so is the client's side of a connection the server closed: a
//! replica reconnecting to a dead master must see it gone, not wait in its
//! handshake.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

use crate::Listening;

/// A proxy on a port of its own, relaying to the server at `upstream`; its
/// runtime (and every connection) ends when it is dropped.
pub struct TcpProxy {
    listening: Listening,
    cut: Arc<AtomicBool>,
}

impl TcpProxy {
    /// Listens on a free port of 127.0.0.1, relaying to `upstream` there.
    pub fn start(upstream: u16) -> Self {
        let cut = Arc::new(AtomicBool::new(false));
        let cuts = Arc::clone(&cut);
        let listening = Listening::start(move |listener| accept(listener, upstream, cuts));
        Self { listening, cut }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.listening.port()
    }

    /// From now on, drops what the server sends on replication connections
    /// (those open and those to come).
    pub fn cut_replication(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }
}

async fn accept(listener: TcpListener, upstream: u16, cut: Arc<AtomicBool>) {
    while let Ok((client, _)) = listener.accept().await {
        tokio::spawn(relay(client, upstream, Arc::clone(&cut)));
    }
}

/// Relays one connection both ways until either side closes, then closes
/// both.
async fn relay(client: TcpStream, upstream: u16, cut: Arc<AtomicBool>) {
    // No server: the client's connection is dropped (closed) at once.
    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
        return;
    };
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let replication = Arc::new(AtomicBool::new(false));
    let marked = Arc::clone(&replication);
    let up = forward(client_read, server_write, move |bytes| {
        if contains(bytes, b"PSYNC") || contains(bytes, b"\r\nSYNC\r\n") {
            marked.store(true, Ordering::SeqCst);
        }
        true
    });
    let down = forward(server_read, client_write, move |_| {
        !(replication.load(Ordering::SeqCst) && cut.load(Ordering::SeqCst))
    });
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}

/// Copies `from` to `to`, each chunk only if `pass(chunk)`, until `from`
/// ends or either fails.
async fn forward(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut pass: impl FnMut(&[u8]) -> bool) {
    let mut buffer = vec![0; 64 * 1024];
    loop {
        match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => {
                if pass(&buffer[..read]) && to.write_all(&buffer[..read]).await.is_err() {
                    return;
                }
            }
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|window| window == needle)
}
