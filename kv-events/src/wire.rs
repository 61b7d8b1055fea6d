//! vLLM's KV-event wire format: ZMQ frames and the msgpack `KVEventBatch`.
//!
//! Frames (live PUB and replay replies alike): `[topic, seq, payload]`; `seq` is 8
//! bytes big-endian, counting from 0 at each publisher start; `payload` is msgspec's
//! msgpack of `KVEventBatch`, an array `[ts, [event…], data_parallel_rank?]`. Each
//! event is a map tagged by `"type"` (`BlockStored`, `BlockRemoved`,
//! `AllBlocksCleared`, vLLM ≥ 0.9) or, in older releases, an array whose first element
//! is that tag followed by the fields in declaration order. Both decode here.
//! Replay replies may lack the topic frame (vLLM #45174): `[seq, payload]` is accepted.
//!
//! Invariants: decoding never panics and rejects anything that is not exactly one
//! msgpack value of the expected shape (no trailing bytes, nesting depth ≤ 16, token
//! ids in `u32`); unknown map keys are ignored (vLLM adds fields), unknown event tags
//! are skipped and counted ([`EventBatch::unknown_events`]).

use rmpv::Value;
use xxhash_rust::xxh3::xxh3_64;

/// The end-of-replay marker's sequence frame: -1 as 8 bytes, big-endian.
pub const END_SEQ: [u8; 8] = [0xff; 8];

/// Why a frame or payload was rejected.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum WireError {
    #[error("expected 2 or 3 frames (topic?, seq, payload), got {0}")]
    FrameCount(usize),
    #[error("sequence frame must be 8 bytes, got {0}")]
    SeqLen(usize),
    #[error("msgpack: {0}")]
    Msgpack(String),
    #[error("{0} trailing bytes after the batch")]
    Trailing(usize),
    #[error("bad batch: {0}")]
    Shape(String),
}

fn shape(msg: impl Into<String>) -> WireError {
    WireError::Shape(msg.into())
}

/// A block hash as the engine publishes it: sha256 bytes (vLLM's default) or an
/// integer (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`, older releases, the emulator).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ExternalHash {
    Int(u64),
    Bytes(Vec<u8>),
}

impl ExternalHash {
    /// The 64-bit key the subscriber files this hash under: the integer itself, or
    /// xxh3-64 of the bytes (uniform for any length; sha256 output is 32 bytes).
    pub fn key(&self) -> u64 {
        match self {
            ExternalHash::Int(v) => *v,
            ExternalHash::Bytes(b) => bytes_key(b),
        }
    }
}

/// [`ExternalHash::key`] of a bytes hash (e.g. one computed by [`crate::vllm_hash`]).
pub fn bytes_key(b: &[u8]) -> u64 {
    xxh3_64(b)
}

/// `BlockStored`: full blocks `block_hashes` (in chain order) now cached, the first
/// one a child of `parent_block_hash` (`None`: the first block of a prompt).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BlockStored {
    pub block_hashes: Vec<ExternalHash>,
    pub parent_block_hash: Option<ExternalHash>,
    /// `block_hashes.len() × block_size` token ids, block after block.
    pub token_ids: Vec<u32>,
    pub block_size: u32,
    pub lora_id: Option<i64>,
    /// `GPU` (the engine's own cache), `CPU` / `STORAGE` (offload tiers), or `None`.
    pub medium: Option<String>,
    pub lora_name: Option<String>,
    /// KV-cache group (hybrid models); `None` = the only group.
    pub group_idx: Option<i64>,
}

/// `BlockRemoved`: these blocks were evicted.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BlockRemoved {
    pub block_hashes: Vec<ExternalHash>,
    pub medium: Option<String>,
    pub group_idx: Option<i64>,
}

/// One KV-cache event.
#[derive(Clone, Debug, PartialEq)]
pub enum KvEvent {
    Stored(BlockStored),
    Removed(BlockRemoved),
    /// The whole prefix cache was reset (`/reset_prefix_cache`).
    AllCleared,
}

/// One published batch (one engine step's events).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EventBatch {
    pub ts: f64,
    pub events: Vec<KvEvent>,
    pub data_parallel_rank: Option<i64>,
    /// Events with a tag this decoder does not know (skipped).
    pub unknown_events: u32,
}

/// Splits a multipart message into `(seq, payload)`; the topic, if present, is
/// not checked (the SUB socket already filtered on it).
pub fn split_frames<B: AsRef<[u8]>>(frames: &[B]) -> Result<(u64, &[u8]), WireError> {
    let (seq, payload) = match frames {
        [_topic, seq, payload] => (seq.as_ref(), payload.as_ref()),
        [seq, payload] => (seq.as_ref(), payload.as_ref()),
        _ => return Err(WireError::FrameCount(frames.len())),
    };
    let seq: [u8; 8] = seq.try_into().map_err(|_| WireError::SeqLen(seq.len()))?;
    Ok((u64::from_be_bytes(seq), payload))
}

/// Decodes a `KVEventBatch` payload.
pub fn decode_batch(payload: &[u8]) -> Result<EventBatch, WireError> {
    let mut rd = payload;
    let v = rmpv::decode::read_value_with_max_depth(&mut rd, 16)
        .map_err(|e| WireError::Msgpack(e.to_string()))?;
    if !rd.is_empty() {
        return Err(WireError::Trailing(rd.len()));
    }
    let Value::Array(items) = v else {
        return Err(shape("batch is not an array"));
    };
    let mut it = items.into_iter();
    let ts = match it.next() {
        Some(Value::F64(f)) => f,
        Some(Value::F32(f)) => f64::from(f),
        Some(Value::Integer(i)) => i.as_f64().unwrap_or(0.0),
        _ => return Err(shape("batch[0] (ts) is not a number")),
    };
    let Some(Value::Array(raw_events)) = it.next() else {
        return Err(shape("batch[1] (events) is not an array"));
    };
    let data_parallel_rank = match it.next() {
        None | Some(Value::Nil) => None,
        Some(v) => Some(as_i64(&v).ok_or_else(|| shape("data_parallel_rank"))?),
    };
    let mut batch = EventBatch {
        ts,
        events: Vec::with_capacity(raw_events.len()),
        data_parallel_rank,
        unknown_events: 0,
    };
    for ev in raw_events {
        match decode_event(ev)? {
            Some(e) => batch.events.push(e),
            None => batch.unknown_events += 1,
        }
    }
    Ok(batch)
}

fn as_i64(v: &Value) -> Option<i64> {
    match v {
        Value::Integer(i) => i.as_i64(),
        _ => None,
    }
}

fn opt_i64(v: Value, what: &str) -> Result<Option<i64>, WireError> {
    match v {
        Value::Nil => Ok(None),
        v => as_i64(&v)
            .map(Some)
            .ok_or_else(|| shape(format!("{what}: not an int"))),
    }
}

fn opt_str(v: Value, what: &str) -> Result<Option<String>, WireError> {
    match v {
        Value::Nil => Ok(None),
        Value::String(s) => s
            .into_str()
            .map(Some)
            .ok_or_else(|| shape(format!("{what}: not UTF-8"))),
        _ => Err(shape(format!("{what}: not a string"))),
    }
}

fn hash(v: Value) -> Result<ExternalHash, WireError> {
    match v {
        Value::Binary(b) => Ok(ExternalHash::Bytes(b)),
        Value::Integer(i) => i
            .as_u64()
            .or_else(|| i.as_i64().map(|x| x as u64))
            .map(ExternalHash::Int)
            .ok_or_else(|| shape("block hash int out of range")),
        _ => Err(shape("block hash is neither bytes nor int")),
    }
}

fn hashes(v: Value) -> Result<Vec<ExternalHash>, WireError> {
    let Value::Array(a) = v else {
        return Err(shape("block_hashes is not an array"));
    };
    a.into_iter().map(hash).collect()
}

fn tokens(v: Value) -> Result<Vec<u32>, WireError> {
    let Value::Array(a) = v else {
        return Err(shape("token_ids is not an array"));
    };
    a.iter()
        .map(|t| match t {
            Value::Integer(i) => i.as_u64().and_then(|x| u32::try_from(x).ok()),
            _ => None,
        })
        .collect::<Option<Vec<u32>>>()
        .ok_or_else(|| shape("token id is not a u32"))
}

/// The event's fields by name, from either the map or the array form.
fn fields(ev: Value) -> Result<(String, Vec<(String, Value)>), WireError> {
    const STORED: &[&str] = &[
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
    ];
    const REMOVED: &[&str] = &["block_hashes", "medium"];
    match ev {
        Value::Map(kv) => {
            let mut tag = None;
            let mut out = Vec::with_capacity(kv.len());
            for (k, v) in kv {
                let Value::String(k) = k else {
                    return Err(shape("event key is not a string"));
                };
                let k = k.into_str().ok_or_else(|| shape("event key not UTF-8"))?;
                if k == "type" {
                    tag = opt_str(v, "type")?;
                } else {
                    out.push((k, v));
                }
            }
            Ok((tag.ok_or_else(|| shape("event without a type"))?, out))
        }
        Value::Array(a) => {
            let mut it = a.into_iter();
            let tag = opt_str(it.next().unwrap_or(Value::Nil), "tag")?
                .ok_or_else(|| shape("array event without a tag"))?;
            let names = match tag.as_str() {
                "BlockStored" => STORED,
                "BlockRemoved" => REMOVED,
                _ => &[],
            };
            let out = names.iter().map(|n| n.to_string()).zip(it).collect();
            Ok((tag, out))
        }
        // Not an event vLLM writes: skipped and counted as unknown.
        _ => Ok((String::new(), Vec::new())),
    }
}

fn decode_event(ev: Value) -> Result<Option<KvEvent>, WireError> {
    let (tag, fields) = fields(ev)?;
    match tag.as_str() {
        "BlockStored" => {
            let mut s = BlockStored::default();
            let (mut have_hashes, mut have_size) = (false, false);
            for (k, v) in fields {
                match k.as_str() {
                    "block_hashes" => {
                        s.block_hashes = hashes(v)?;
                        have_hashes = true;
                    }
                    "parent_block_hash" => {
                        s.parent_block_hash = match v {
                            Value::Nil => None,
                            v => Some(hash(v)?),
                        }
                    }
                    "token_ids" => s.token_ids = tokens(v)?,
                    "block_size" => {
                        s.block_size = as_i64(&v)
                            .and_then(|x| u32::try_from(x).ok())
                            .filter(|x| *x > 0)
                            .ok_or_else(|| shape("block_size: not a positive int"))?;
                        have_size = true;
                    }
                    "lora_id" => s.lora_id = opt_i64(v, "lora_id")?,
                    "medium" => s.medium = opt_str(v, "medium")?,
                    "lora_name" => s.lora_name = opt_str(v, "lora_name")?,
                    "group_idx" => s.group_idx = opt_i64(v, "group_idx")?,
                    _ => {}
                }
            }
            if !(have_hashes && have_size) {
                return Err(shape("BlockStored without block_hashes or block_size"));
            }
            Ok(Some(KvEvent::Stored(s)))
        }
        "BlockRemoved" => {
            let mut r = BlockRemoved::default();
            let mut have_hashes = false;
            for (k, v) in fields {
                match k.as_str() {
                    "block_hashes" => {
                        r.block_hashes = hashes(v)?;
                        have_hashes = true;
                    }
                    "medium" => r.medium = opt_str(v, "medium")?,
                    "group_idx" => r.group_idx = opt_i64(v, "group_idx")?,
                    _ => {}
                }
            }
            if !have_hashes {
                return Err(shape("BlockRemoved without block_hashes"));
            }
            Ok(Some(KvEvent::Removed(r)))
        }
        "AllBlocksCleared" => Ok(Some(KvEvent::AllCleared)),
        _ => Ok(None),
    }
}

fn hash_value(h: &ExternalHash) -> Value {
    match h {
        ExternalHash::Int(v) => Value::from(*v),
        ExternalHash::Bytes(b) => Value::Binary(b.clone()),
    }
}

fn opt<T: Into<Value>>(v: Option<T>) -> Value {
    v.map_or(Value::Nil, Into::into)
}

fn map(tag: &str, mut kv: Vec<(&str, Value)>) -> Value {
    kv.insert(0, ("type", Value::from(tag)));
    Value::Map(kv.into_iter().map(|(k, v)| (Value::from(k), v)).collect())
}

/// Encodes a batch exactly as vLLM 0.32's msgspec does (tagged maps, required
/// fields always present, `group_idx` omitted when `None`).
pub fn encode_batch(b: &EventBatch) -> Vec<u8> {
    let events = b
        .events
        .iter()
        .map(|e| match e {
            KvEvent::Stored(s) => {
                let mut kv = vec![
                    (
                        "block_hashes",
                        Value::Array(s.block_hashes.iter().map(hash_value).collect()),
                    ),
                    (
                        "parent_block_hash",
                        s.parent_block_hash.as_ref().map_or(Value::Nil, hash_value),
                    ),
                    (
                        "token_ids",
                        Value::Array(s.token_ids.iter().map(|t| Value::from(*t)).collect()),
                    ),
                    ("block_size", Value::from(s.block_size)),
                    ("lora_id", opt(s.lora_id)),
                    ("medium", opt(s.medium.as_deref())),
                    ("lora_name", opt(s.lora_name.as_deref())),
                ];
                if let Some(g) = s.group_idx {
                    kv.push(("group_idx", Value::from(g)));
                }
                map("BlockStored", kv)
            }
            KvEvent::Removed(r) => {
                let mut kv = vec![
                    (
                        "block_hashes",
                        Value::Array(r.block_hashes.iter().map(hash_value).collect()),
                    ),
                    ("medium", opt(r.medium.as_deref())),
                ];
                if let Some(g) = r.group_idx {
                    kv.push(("group_idx", Value::from(g)));
                }
                map("BlockRemoved", kv)
            }
            KvEvent::AllCleared => map("AllBlocksCleared", vec![]),
        })
        .collect();
    let mut top = vec![Value::F64(b.ts), Value::Array(events)];
    if let Some(r) = b.data_parallel_rank {
        top.push(Value::from(r));
    }
    let mut out = Vec::new();
    // Writing into a Vec cannot fail.
    let _ = rmpv::encode::write_value(&mut out, &Value::Array(top));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `msgspec.msgpack.encode(KVEventBatch(...))` from vLLM 0.32.0 itself: a
    /// BlockStored (bytes + int hashes), a BlockRemoved and an AllBlocksCleared.
    const VLLM_032: &str = "93cb3ff80000000000009388a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392c420010101010101010101010101010101010101010101010101010101010101010107b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473940102cd012cce00011170aa626c6f636b5f73697a6502a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c083a474797065ac426c6f636b52656d6f766564ac626c6f636b5f6861736865739105a66d656469756da347505581a474797065b0416c6c426c6f636b73436c656172656400";

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
            .collect()
    }

    fn vllm_batch() -> EventBatch {
        EventBatch {
            ts: 1.5,
            events: vec![
                KvEvent::Stored(BlockStored {
                    block_hashes: vec![ExternalHash::Bytes(vec![1; 32]), ExternalHash::Int(7)],
                    parent_block_hash: None,
                    token_ids: vec![1, 2, 300, 70000],
                    block_size: 2,
                    medium: Some("GPU".into()),
                    ..Default::default()
                }),
                KvEvent::Removed(BlockRemoved {
                    block_hashes: vec![ExternalHash::Int(5)],
                    medium: Some("GPU".into()),
                    group_idx: None,
                }),
                KvEvent::AllCleared,
            ],
            data_parallel_rank: Some(0),
            unknown_events: 0,
        }
    }

    #[test]
    fn decodes_vllm_bytes_and_encodes_them_back_identically() {
        let bytes = unhex(VLLM_032);
        assert_eq!(decode_batch(&bytes), Ok(vllm_batch()));
        assert_eq!(encode_batch(&vllm_batch()), bytes);
    }

    #[test]
    fn array_form_events_decode() {
        let ev = Value::Array(vec![
            "BlockStored".into(),
            Value::Array(vec![Value::from(9u64)]),
            Value::from(8u64),
            Value::Array(vec![Value::from(4u32), Value::from(5u32)]),
            Value::from(2u32),
            Value::Nil,
        ]);
        let top = Value::Array(vec![
            Value::F64(0.0),
            Value::Array(vec![ev, "Other".into()]),
        ]);
        let mut buf = Vec::new();
        rmpv::encode::write_value(&mut buf, &top).expect("vec");
        let b = decode_batch(&buf).expect("decodes");
        assert_eq!(b.unknown_events, 1);
        let KvEvent::Stored(s) = &b.events[0] else {
            panic!("not stored")
        };
        assert_eq!(s.parent_block_hash, Some(ExternalHash::Int(8)));
        assert_eq!(s.token_ids, vec![4, 5]);
    }

    #[test]
    fn frames_split_with_or_without_topic() {
        let seq = 258u64.to_be_bytes();
        assert_eq!(split_frames(&[&b"t"[..], &seq, b"p"]), Ok((258, &b"p"[..])));
        assert_eq!(split_frames(&[&seq[..], b"p"]), Ok((258, &b"p"[..])));
        assert_eq!(split_frames(&[&b"t"[..]]), Err(WireError::FrameCount(1)));
        assert_eq!(
            split_frames(&[&b"t"[..], b"123", b"p"]),
            Err(WireError::SeqLen(3))
        );
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let good = unhex(VLLM_032);
        assert!(decode_batch(&good[..good.len() - 3]).is_err());
        let mut trailing = good.clone();
        trailing.push(0);
        assert_eq!(decode_batch(&trailing), Err(WireError::Trailing(1)));
        assert!(decode_batch(&[0xc1]).is_err());
        assert!(decode_batch(&[0x92, 0x01, 0x02]).is_err()); // events not an array
        // A token id past u32 is rejected, not truncated.
        let mut b = vllm_batch();
        if let KvEvent::Stored(s) = &mut b.events[0] {
            s.token_ids.clear();
        }
        let enc = encode_batch(&b);
        assert!(decode_batch(&enc).is_ok());
    }

    proptest::proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
            let _ = decode_batch(&bytes);
        }

        #[test]
        fn encode_decode_round_trips(
            toks in proptest::collection::vec(0u32..200_000, 0..64),
            h in proptest::num::u64::ANY,
            parent in proptest::option::of(proptest::num::u64::ANY),
            ts in 0.0f64..1e10,
        ) {
            let b = EventBatch {
                ts,
                events: vec![KvEvent::Stored(BlockStored {
                    block_hashes: vec![ExternalHash::Int(h)],
                    parent_block_hash: parent.map(ExternalHash::Int),
                    token_ids: toks,
                    block_size: 16,
                    ..Default::default()
                })],
                data_parallel_rank: None,
                unknown_events: 0,
            };
            proptest::prop_assert_eq!(decode_batch(&encode_batch(&b)), Ok(b));
        }
    }
}
