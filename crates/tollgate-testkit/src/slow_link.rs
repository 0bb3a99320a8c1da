//! A TCP link between two places on 127.0.0.1 that are far apart: every
//! byte arrives a configured one-way delay after it was sent, in order,
//! each way, and the link can be cut (every connection closed, new ones
//! refused) and restored. What a region reaching another region's Redis
//! sees, on one machine.

use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::Listening;

/// A link on a port of its own to the server at `upstream`; its runtime
/// (and every connection) ends when it is dropped.
pub struct SlowLink {
    listening: Listening,
    /// True while the link is cut.
    cut: watch::Sender<bool>,
}

impl SlowLink {
    /// Listens on a free port of 127.0.0.1, relaying to `upstream` there,
    /// each byte `delay` after it was sent, each way.
    pub fn start(upstream: u16, delay: Duration) -> Self {
        let (cut, cuts) = watch::channel(false);
        let listening = Listening::start(|listener| accept(listener, upstream, delay, cuts));
        Self { listening, cut }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.listening.port()
    }

    /// Cuts the link: every connection is closed, and new ones are closed
    /// as they come, until [`SlowLink::restore`].
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Restores a cut link: new connections go through again.
    pub fn restore(&self) {
        self.cut.send_replace(false);
    }
}

async fn accept(listener: TcpListener, upstream: u16, delay: Duration, cuts: watch::Receiver<bool>) {
    while let Ok((client, _)) = listener.accept().await {
        if *cuts.borrow() {
            // Cut: the connection is closed as it comes.
            continue;
        }
        tokio::spawn(relay(client, upstream, delay, cuts.clone()));
    }
}

/// Relays one connection both ways, each byte `delay` late, until either
/// side closes or the link is cut, then closes both.
async fn relay(client: TcpStream, upstream: u16, delay: Duration, mut cuts: watch::Receiver<bool>) {
    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
        return;
    };
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    // Either way ending, or a cut, drops both: the connections close.
    tokio::select! {
        () = late(client_read, server_write, delay) => {}
        () = late(server_read, client_write, delay) => {}
        _ = cuts.wait_for(|cut| *cut) => {}
    }
}

/// Copies `from` to `to`, each chunk `delay` after it was read, in order,
/// until `from` ends or either fails.
async fn late(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, delay: Duration) {
    let (chunks, mut due) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = async move {
        while let Some((at, chunk)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
    };
    let reader = async move {
        let mut buffer = vec![0; 64 * 1024];
        loop {
            match from.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(read) => {
                    if chunks.send((Instant::now() + delay, buffer[..read].to_vec())).is_err() {
                        return;
                    }
                }
            }
        }
    };
    // The reader ending (the sender closed) lets the writer deliver what is
    // still in flight, then end.
    let ((), ()) = tokio::join!(reader, writer);
}

#[cfg(test)]
mod tests {
    use std::io::{Read as _, Write as _};
    use std::net::{TcpListener, TcpStream};
    use std::time::{Duration, Instant};

    use super::SlowLink;

    /// An echo server on a free port, answering each connection on a
    /// thread of its own.
    fn echo() -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut stream = stream;
                    let mut buffer = [0; 1024];
                    while let Ok(read @ 1..) = stream.read(&mut buffer) {
                        if stream.write_all(&buffer[..read]).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        port
    }

    fn round_trip(stream: &mut TcpStream, bytes: &[u8]) -> Duration {
        let start = Instant::now();
        stream.write_all(bytes).unwrap();
        let mut answer = vec![0; bytes.len()];
        stream.read_exact(&mut answer).unwrap();
        assert_eq!(answer, bytes);
        start.elapsed()
    }

    #[test]
    fn a_round_trip_takes_the_delay_each_way_and_a_cut_closes_the_link() {
        let delay = Duration::from_millis(40);
        let link = SlowLink::start(echo(), delay);
        let mut stream = TcpStream::connect(("127.0.0.1", link.port())).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        for bytes in [&b"ping"[..], b"a second message, in order"] {
            assert!(round_trip(&mut stream, bytes) >= 2 * delay);
        }
        link.cut();
        // The open connection ends, and a new one is closed as it comes.
        let mut rest = Vec::new();
        let _ = stream.read_to_end(&mut rest);
        assert!(rest.is_empty());
        let mut refused = TcpStream::connect(("127.0.0.1", link.port())).unwrap();
        refused.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = refused.write_all(b"x");
        assert!(matches!(refused.read(&mut [0; 1]), Ok(0) | Err(_)));
        link.restore();
        let mut again = TcpStream::connect(("127.0.0.1", link.port())).unwrap();
        again.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert!(round_trip(&mut again, b"back") >= 2 * delay);
    }
}
