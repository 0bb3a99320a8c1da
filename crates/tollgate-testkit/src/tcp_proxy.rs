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

/// A proxy on a port of its own, relaying to the server at `upstream`; its
/// runtime (and every connection) ends when it is dropped.
pub struct TcpProxy {
    port: u16,
    cut: Arc<AtomicBool>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl TcpProxy {
    /// Listens on a free port of 127.0.0.1, relaying to `upstream` there.
    pub fn start(upstream: u16) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("the proxy's runtime");
        let listener = runtime
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .expect("the proxy binds a port");
        let port = listener.local_addr().expect("local address").port();
        let cut = Arc::new(AtomicBool::new(false));
        runtime.spawn(accept(listener, upstream, Arc::clone(&cut)));
        Self {
            port,
            cut,
            runtime: Some(runtime),
        }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// From now on, drops what the server sends on replication connections
    /// (those open and those to come).
    pub fn cut_replication(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
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
