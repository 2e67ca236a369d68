//! A TCP proxy on 127.0.0.1 that a test can cut (close every connection, refuse new ones)
//! and restore: an API-server outage as seen by one client.

use std::net::SocketAddr;
use std::sync::Mutex;

use tokio::task::{JoinHandle, JoinSet};

/// The proxy; dropping it stops it.
#[derive(Debug)]
pub struct Proxy {
    /// The port it listens on (127.0.0.1), the same after a [`Proxy::restore`].
    pub port: u16,
    upstream: SocketAddr,
    running: Mutex<Option<JoinHandle<()>>>,
}

impl Proxy {
    /// Proxies `upstream` on a free port.
    pub fn start(upstream: SocketAddr) -> std::io::Result<Proxy> {
        let proxy = Proxy {
            port: crate::free_port().map_err(std::io::Error::other)?,
            upstream,
            running: Mutex::new(None),
        };
        proxy.restore()?;
        Ok(proxy)
    }

    /// Accepts connections (again) on the same port.
    pub fn restore(&self) -> std::io::Result<()> {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.set_reuseaddr(true)?;
        socket.bind(SocketAddr::from(([127, 0, 0, 1], self.port)))?;
        let listener = socket.listen(128)?;
        let upstream = self.upstream;
        let task = tokio::spawn(async move {
            // Aborting this task drops the JoinSet, which aborts (closes) every connection.
            let mut conns = JoinSet::new();
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    continue;
                };
                conns.spawn(async move {
                    if let Ok(mut out) = tokio::net::TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                    }
                });
                while conns.try_join_next().is_some() {}
            }
        });
        *self.running.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
        Ok(())
    }

    /// Closes every connection and the listener (new connections are refused).
    pub async fn cut(&self) {
        let task = self.take();
        if let Some(task) = task {
            task.abort();
            let _ = task.await;
        }
    }

    fn take(&self) -> Option<JoinHandle<()>> {
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(t) = self.take() {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_cut_proxy_refuses_and_a_restored_one_forwards() {
        let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = upstream.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = upstream.accept().await {
                let _ = s.write_all(b"hello").await;
            }
        });
        let proxy = Proxy::start(addr).unwrap();
        let read = || async {
            let mut s = tokio::net::TcpStream::connect(("127.0.0.1", proxy.port)).await?;
            let mut out = String::new();
            s.read_to_string(&mut out).await?;
            std::io::Result::Ok(out)
        };
        assert_eq!(read().await.unwrap(), "hello");
        proxy.cut().await;
        assert!(read().await.is_err());
        proxy.restore().unwrap();
        assert_eq!(read().await.unwrap(), "hello");
    }
}
