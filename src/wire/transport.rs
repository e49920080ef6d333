//! The byte stream under the frames: dialling and accepting TCP connections. TLS, when it
//! comes, lands here and only here: the rest of the wire sees a [`Stream`].

use std::net::SocketAddr;
use std::time::Duration;

use super::Error;

/// A connection's byte stream.
pub(crate) type Stream = tokio::net::TcpStream;

/// Dials `addr` within `timeout`: the stream (without Nagle's delay: frames are flushed in
/// batches already) and the peer's name for messages.
///
/// # Errors
///
/// [`Error::Address`] for an address that does not resolve, refuses, or does not answer in
/// time.
pub(crate) async fn dial(addr: &str, timeout: Duration) -> Result<(Stream, String), Error> {
    let address = |source| Error::Address {
        addr: addr.to_owned(),
        source,
    };
    let stream = tokio::time::timeout(timeout, Stream::connect(addr))
        .await
        .map_err(|_| address(std::io::ErrorKind::TimedOut.into()))?
        .map_err(address)?;
    let _ = stream.set_nodelay(true);
    let peer = stream
        .peer_addr()
        .map_or_else(|_| addr.to_owned(), |a: SocketAddr| a.to_string());
    Ok((stream, peer))
}

/// A bound listening socket.
#[derive(Debug)]
pub(crate) struct Acceptor(tokio::net::TcpListener);

impl Acceptor {
    /// Binds `asked` (say `127.0.0.1:0`) for the runtime `io`; the acceptor and the address
    /// it is bound to.
    ///
    /// # Errors
    ///
    /// [`Error::Address`] if the address cannot be bound.
    pub(crate) fn bind(
        asked: &str,
        io: &tokio::runtime::Handle,
    ) -> Result<(Acceptor, SocketAddr), Error> {
        let address = |source| Error::Address {
            addr: asked.to_owned(),
            source,
        };
        let std_listener = std::net::TcpListener::bind(asked).map_err(address)?;
        let addr = std_listener.local_addr().map_err(address)?;
        std_listener.set_nonblocking(true).map_err(address)?;
        let _enter = io.enter();
        let listener = tokio::net::TcpListener::from_std(std_listener).map_err(address)?;
        Ok((Acceptor(listener), addr))
    }

    /// The next connection and its peer's address.
    pub(crate) async fn accept(&self) -> std::io::Result<(Stream, SocketAddr)> {
        self.0.accept().await
    }
}
