//! chitchat's `Transport`/`Socket` traits over [`super::Transport`]. One socket per
//! cluster (channel); `send` never waits, `recv` is cancel-safe (an mpsc receive).

use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;
use chitchat::ChitchatMessage;
use parking_lot::Mutex;
use tokio::sync::mpsc;

use super::Transport;
use super::frame::Channel;

/// Hands chitchat a socket exactly once.
pub(crate) struct QuicTransport {
    socket: Mutex<Option<QuicSocket>>,
}

impl QuicTransport {
    pub fn new(
        transport: Arc<Transport>,
        channel: Channel,
        rx: mpsc::Receiver<(SocketAddr, ChitchatMessage)>,
    ) -> Self {
        Self {
            socket: Mutex::new(Some(QuicSocket {
                transport,
                channel,
                rx,
            })),
        }
    }
}

#[async_trait]
impl chitchat::transport::Transport for QuicTransport {
    async fn open(
        &self,
        _listen_addr: SocketAddr,
    ) -> anyhow::Result<Box<dyn chitchat::transport::Socket>> {
        // The QUIC endpoint is already bound; chitchat's listen address is informative.
        let s = self
            .socket
            .lock()
            .take()
            .ok_or_else(|| anyhow::anyhow!("QUIC gossip socket already opened"))?;
        Ok(Box::new(s))
    }
}

pub(crate) struct QuicSocket {
    transport: Arc<Transport>,
    channel: Channel,
    rx: mpsc::Receiver<(SocketAddr, ChitchatMessage)>,
}

#[async_trait]
impl chitchat::transport::Socket for QuicSocket {
    async fn send(&mut self, to: SocketAddr, msg: ChitchatMessage) -> anyhow::Result<()> {
        self.transport.send_message(self.channel, to, &msg);
        Ok(())
    }

    async fn recv(&mut self) -> anyhow::Result<(SocketAddr, ChitchatMessage)> {
        self.rx
            .recv()
            .await
            .ok_or_else(|| anyhow::anyhow!("mesh transport shut down"))
    }
}
