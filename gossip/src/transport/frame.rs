//! Framing of one chitchat message on one QUIC uni-stream.
//!
//! ```text
//! 0       frame version (1)
//! 1       channel (0 = regional cluster, 1 = cross-region cluster)
//! 2..4    reserved, zero
//! 4..8    payload length (u32 LE), at most MAX_PAYLOAD
//! 8       sender address family (4 or 6)
//! 9..25   sender advertise IP (v4 uses the first 4 bytes, rest zero)
//! 25..27  sender advertise port (u16 LE)
//! 27..    chitchat message bytes
//! ```
//! Invariants: parsing never panics; the declared length must equal the bytes received.
//! The sender address is a claim, checked against the TLS identity by the receiver.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use chitchat::{ChitchatId, Deserializable};

pub const VERSION: u8 = 1;
pub const HEADER_LEN: usize = 27;
/// chitchat sizes every message for a 65 507-byte UDP payload; allow a little slack.
pub const MAX_PAYLOAD: usize = 65_536;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Channel {
    Regional = 0,
    Global = 1,
}

impl Channel {
    pub fn index(self) -> usize {
        self as usize
    }
}

pub fn write_header(buf: &mut Vec<u8>, channel: Channel, sender: SocketAddr, payload_len: usize) {
    buf.push(VERSION);
    buf.push(channel as u8);
    buf.extend_from_slice(&[0, 0]);
    buf.extend_from_slice(&(payload_len as u32).to_le_bytes());
    let mut ip = [0u8; 16];
    match sender.ip() {
        IpAddr::V4(v4) => {
            buf.push(4);
            ip[..4].copy_from_slice(&v4.octets());
        }
        IpAddr::V6(v6) => {
            buf.push(6);
            ip.copy_from_slice(&v6.octets());
        }
    }
    buf.extend_from_slice(&ip);
    buf.extend_from_slice(&sender.port().to_le_bytes());
}

#[derive(Debug)]
pub struct Frame<'a> {
    pub channel: Channel,
    pub sender: SocketAddr,
    pub payload: &'a [u8],
}

pub fn parse(bytes: &[u8]) -> Option<Frame<'_>> {
    if bytes.len() < HEADER_LEN || bytes[0] != VERSION || bytes[2..4] != [0, 0] {
        return None;
    }
    let channel = match bytes[1] {
        0 => Channel::Regional,
        1 => Channel::Global,
        _ => return None,
    };
    let len = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]) as usize;
    if len > MAX_PAYLOAD || bytes.len() != HEADER_LEN + len {
        return None;
    }
    let mut ip16 = [0u8; 16];
    ip16.copy_from_slice(&bytes[9..25]);
    let ip = match bytes[8] {
        4 => IpAddr::V4(Ipv4Addr::new(ip16[0], ip16[1], ip16[2], ip16[3])),
        6 => IpAddr::V6(Ipv6Addr::from(ip16)),
        _ => return None,
    };
    let port = u16::from_le_bytes([bytes[25], bytes[26]]);
    Some(Frame {
        channel,
        sender: SocketAddr::new(ip, port),
        payload: &bytes[HEADER_LEN..],
    })
}

/// For Syn (type 0) and SynAck (type 1) messages: the node ids in the sender's digest.
/// Relies on chitchat 0.11's layout: magic (2) + version (1) + type (1) + digest
/// (u16 count, then per node a ChitchatId and three u64s). `None` for other types or
/// malformed input.
pub fn digest_ids(payload: &[u8]) -> Option<Vec<ChitchatId>> {
    if payload.len() < 4 || payload[3] > 1 {
        return None;
    }
    let mut buf = &payload[4..];
    let n = u16::deserialize(&mut buf).ok()?;
    let mut ids = Vec::with_capacity(n as usize);
    for _ in 0..n {
        ids.push(ChitchatId::deserialize(&mut buf).ok()?);
        for _ in 0..3 {
            u64::deserialize(&mut buf).ok()?;
        }
    }
    Some(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_rejects_mismatched_length() {
        for addr in ["127.0.0.1:7000", "[::1]:9"] {
            let addr: SocketAddr = addr.parse().unwrap();
            let mut buf = Vec::new();
            write_header(&mut buf, Channel::Global, addr, 3);
            buf.extend_from_slice(b"abc");
            let f = parse(&buf).unwrap();
            assert_eq!(f.channel, Channel::Global);
            assert_eq!(f.sender, addr);
            assert_eq!(f.payload, b"abc");
            buf.push(0);
            assert!(parse(&buf).is_none(), "trailing byte must be refused");
        }
        assert!(parse(&[1, 0, 0]).is_none());
        assert!(parse(&[9; 40]).is_none());
    }

    /// Guards the layout `digest_ids` relies on: a Syn built by hand in that layout must
    /// be accepted by chitchat's own decoder, and yield the digest's ids.
    #[test]
    fn digest_layout_matches_chitchat_0_11() {
        use chitchat::{ChitchatMessage, Serializable};
        let id = ChitchatId::new("n1", 7, "127.0.0.1:9000".parse().unwrap());
        let other = ChitchatId::new("n2", 1, "[::1]:9001".parse().unwrap());
        let mut p = Vec::new();
        p.extend_from_slice(&45_139u16.to_le_bytes()); // chitchat's magic
        p.push(0); // protocol version
        p.push(0); // Syn
        2u16.serialize(&mut p);
        for i in [&id, &other] {
            i.serialize(&mut p);
            for v in [5u64, 0, 3] {
                v.serialize(&mut p);
            }
        }
        "cluster/r1".to_string().serialize(&mut p);
        let msg = ChitchatMessage::deserialize(&mut &p[..]).unwrap();
        assert!(
            matches!(msg, ChitchatMessage::Syn { ref cluster_id, .. } if cluster_id == "cluster/r1")
        );
        let mut ids = digest_ids(&p).unwrap();
        ids.sort();
        assert_eq!(ids, vec![id, other]);
        // Acks (type 2) carry no digest; truncated digests are refused.
        let mut ack = p.clone();
        ack[3] = 2;
        assert!(digest_ids(&ack).is_none());
        assert!(digest_ids(&p[..20]).is_none());
    }
}
