//! A TCP proxy on 127.0.0.1 that a scenario can cut (close every connection, refuse new
//! ones) and restore: an API-server outage as seen by one client.

use std::net::SocketAddr;
use std::sync::Mutex;

use anyhow::{Context, Result};
use tokio::task::{JoinHandle, JoinSet};

/// The proxy; dropping it stops it.
pub struct Proxy {
    pub port: u16,
    upstream: SocketAddr,
    running: Mutex<Option<JoinHandle<()>>>,
}

impl Proxy {
    /// Proxies `upstream` on a free port.
    pub fn start(upstream: SocketAddr) -> Result<Proxy> {
        let proxy = Proxy {
            port: super::env::free_port()?,
            upstream,
            running: Mutex::new(None),
        };
        proxy.restore()?;
        Ok(proxy)
    }

    /// Accepts connections (again) on the same port.
    pub fn restore(&self) -> Result<()> {
        let socket = tokio::net::TcpSocket::new_v4().context("creating the proxy socket")?;
        socket.set_reuseaddr(true)?;
        socket
            .bind(SocketAddr::from(([127, 0, 0, 1], self.port)))
            .with_context(|| format!("binding the proxy to port {}", self.port))?;
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

    /// Closes every connection and the listener.
    pub async fn cut(&self) {
        let task = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(task) = task {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(t) = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            t.abort();
        }
    }
}
