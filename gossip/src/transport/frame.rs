//! Framing of one chitchat message on one QUIC uni-stream.
//!
//! ```text
//! 0       frame version (1)
//! 1       channel (0 = regional cluster, 1 = cross-region cluster)
//! 2       payload encoding (0 = raw, 1 = zstd)
//! 3       reserved, zero
//! 4..8    payload length (u32 LE, as sent), at most MAX_PAYLOAD
//! 8       sender address family (4 or 6)
//! 9..25   sender advertise IP (v4 uses the first 4 bytes, rest zero)
//! 25..27  sender advertise port (u16 LE)
//! 27..    chitchat message bytes
//! ```
//! Invariants: parsing never panics; the declared length must equal the bytes received;
//! a compressed payload inflates to at most MAX_PAYLOAD or is refused. The sender
//! address is a claim, checked against the TLS identity by the receiver.
//!
//! Why compress: chitchat puts its whole digest (≈ 45 B per member: id, generation,
//! address, three u64 counters, mostly zero bytes) in every Syn and SynAck, ~6 per node
//! per round, so a node's gossip bytes grow with the member count. zstd at level 1
//! shrinks such a digest ≈ 3× (a 64-member one from 2.8 KB to ≈ 0.9 KB). Nodes that
//! predate the encoding byte refuse compressed frames: a mesh upgrading from them runs
//! with `compress` off until every node is new.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use chitchat::{ChitchatId, Deserializable};

pub const VERSION: u8 = 1;
pub const HEADER_LEN: usize = 27;
const RAW: u8 = 0;
const ZSTD: u8 = 1;
/// Payloads shorter than this are sent raw: an Ack or a small Syn gains nothing.
const COMPRESS_MIN: usize = 128;
const ZSTD_LEVEL: i32 = 1;
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

fn write_header(
    buf: &mut Vec<u8>,
    channel: Channel,
    encoding: u8,
    sender: SocketAddr,
    payload_len: usize,
) {
    buf.push(VERSION);
    buf.push(channel as u8);
    buf.extend_from_slice(&[encoding, 0]);
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

/// A whole frame: the header, then `payload` (a serialized chitchat message),
/// compressed when `compress` and it pays. `None` if the payload is over MAX_PAYLOAD.
pub fn encode(
    channel: Channel,
    sender: SocketAddr,
    payload: &[u8],
    compress: bool,
) -> Option<Vec<u8>> {
    let packed = (compress && payload.len() >= COMPRESS_MIN)
        .then(|| zstd::bulk::compress(payload, ZSTD_LEVEL).ok())
        .flatten()
        .filter(|z| z.len() < payload.len());
    let (encoding, body) = match &packed {
        Some(z) => (ZSTD, z.as_slice()),
        None => (RAW, payload),
    };
    if body.len() > MAX_PAYLOAD || payload.len() > MAX_PAYLOAD {
        return None;
    }
    let mut buf = Vec::with_capacity(HEADER_LEN + body.len());
    write_header(&mut buf, channel, encoding, sender, body.len());
    buf.extend_from_slice(body);
    Some(buf)
}

#[derive(Debug)]
pub struct Frame<'a> {
    pub channel: Channel,
    pub sender: SocketAddr,
    encoding: u8,
    body: &'a [u8],
}

impl Frame<'_> {
    /// The chitchat message bytes, inflated if compressed; `None` if they do not inflate
    /// within MAX_PAYLOAD.
    pub fn payload(&self) -> Option<std::borrow::Cow<'_, [u8]>> {
        match self.encoding {
            ZSTD => zstd::bulk::decompress(self.body, MAX_PAYLOAD)
                .ok()
                .map(std::borrow::Cow::Owned),
            _ => Some(std::borrow::Cow::Borrowed(self.body)),
        }
    }
}

pub fn parse(bytes: &[u8]) -> Option<Frame<'_>> {
    if bytes.len() < HEADER_LEN
        || bytes[0] != VERSION
        || !matches!(bytes[2], RAW | ZSTD)
        || bytes[3] != 0
    {
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
        encoding: bytes[2],
        body: &bytes[HEADER_LEN..],
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
            let mut buf = encode(Channel::Global, addr, b"abc", true).unwrap();
            let f = parse(&buf).unwrap();
            assert_eq!(f.channel, Channel::Global);
            assert_eq!(f.sender, addr);
            assert_eq!(&*f.payload().unwrap(), b"abc");
            buf.push(0);
            assert!(parse(&buf).is_none(), "trailing byte must be refused");
        }
        assert!(parse(&[1, 0, 0]).is_none());
        assert!(parse(&[9; 40]).is_none());
    }

    #[test]
    fn a_digest_sized_payload_shrinks_and_inflates_back() {
        let addr: SocketAddr = "127.0.0.1:7000".parse().unwrap();
        // 64 digest-like entries: short ids, shared address, mostly-zero counters.
        let mut payload = Vec::new();
        for i in 0u64..64 {
            payload.extend_from_slice(format!("n{i}").as_bytes());
            payload.extend_from_slice(&(1_764_900_000_000 + i * 37).to_le_bytes());
            payload.extend_from_slice(&[4, 127, 0, 0, 1, (i % 256) as u8, 0x9c]);
            for v in [i * 11, 0, i * 5] {
                payload.extend_from_slice(&v.to_le_bytes());
            }
        }
        let z = encode(Channel::Regional, addr, &payload, true).unwrap();
        let raw = encode(Channel::Regional, addr, &payload, false).unwrap();
        assert_eq!(raw.len(), HEADER_LEN + payload.len());
        assert!(
            z.len() * 2 < raw.len(),
            "compressed {} vs raw {}",
            z.len(),
            raw.len()
        );
        assert_eq!(&*parse(&z).unwrap().payload().unwrap(), &payload[..]);
        assert_eq!(&*parse(&raw).unwrap().payload().unwrap(), &payload[..]);
    }

    #[test]
    fn a_payload_that_inflates_past_the_cap_or_is_not_zstd_is_refused() {
        let addr: SocketAddr = "127.0.0.1:7000".parse().unwrap();
        let bomb = zstd::bulk::compress(&vec![0u8; MAX_PAYLOAD + 1], 1).unwrap();
        let mut buf = encode(Channel::Regional, addr, b"x", false).unwrap();
        buf.truncate(HEADER_LEN);
        buf[2] = ZSTD;
        buf[4..8].copy_from_slice(&(bomb.len() as u32).to_le_bytes());
        let mut garbage = buf.clone();
        buf.extend_from_slice(&bomb);
        assert!(parse(&buf).unwrap().payload().is_none(), "bomb refused");
        garbage.extend_from_slice(&[7u8; 16]);
        garbage[4..8].copy_from_slice(&16u32.to_le_bytes());
        assert!(parse(&garbage).unwrap().payload().is_none(), "not zstd");
        let mut unknown = encode(Channel::Regional, addr, b"x", false).unwrap();
        unknown[2] = 9;
        assert!(parse(&unknown).is_none(), "unknown encoding");
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
