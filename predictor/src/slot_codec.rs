//! Lossless encoding of a [`FederationSlot`] as plain statistics blocks only, for a
//! transport that carries rows of `{group, target, dim, a_upper, b, sum_w, sum_wyy, n,
//! landmark_s}` and nothing else (the gossip crate's predictor payload).
//!
//! Row kinds by `target`: 0/1 are the TTFT/TPOT statistics themselves; [`TARGET_META`]
//! carries τ, the export time and the codec version; [`TARGET_LABEL_TIMES`] and
//! [`TARGET_CORRECTIONS`] are tables of fixed-width numeric entries packed row-major into
//! `a_upper ++ b` of a dim-[`TABLE_DIM`] block (`group` = chunk index, `n` = entries in the
//! chunk, `sum_w` = entry width). 64-bit ids travel as two exact 32-bit halves. Invariant:
//! every emitted value is finite and every block's shape matches its `dim`, so a
//! transport that validates rows accepts them; decoding validates everything again.

use crate::error::FederationError;
use crate::federation::{
    CorrectionEntry, FederationSlot, LabelTime, StatsBlock, TARGET_TPOT, TARGET_TTFT,
};

/// Row carrying the slot's metadata.
pub const TARGET_META: u8 = 255;
/// Rows carrying the per-block newest label times.
pub const TARGET_LABEL_TIMES: u8 = 254;
/// Rows carrying the per-replica corrections.
pub const TARGET_CORRECTIONS: u8 = 253;
/// Dimension of table rows: 32·33/2 + 32 = 560 numbers each.
pub const TABLE_DIM: u8 = 32;
const CODEC_VERSION: u64 = 2;
const TABLE_CAPACITY: usize =
    (TABLE_DIM as usize) * (TABLE_DIM as usize + 1) / 2 + TABLE_DIM as usize;
const LABEL_WIDTH: usize = 4;
const CORRECTION_WIDTH: usize = 9;

fn split(id: u64) -> [f64; 2] {
    [(id >> 32) as f64, (id & 0xffff_ffff) as f64]
}

fn join(hi: f64, lo: f64) -> Option<u64> {
    let ok = |v: f64| v.fract() == 0.0 && (0.0..4_294_967_296.0).contains(&v);
    (ok(hi) && ok(lo)).then_some(((hi as u64) << 32) | lo as u64)
}

fn pack(target: u8, width: usize, entries: &[Vec<f64>], landmark_s: f64) -> Vec<StatsBlock> {
    let per = TABLE_CAPACITY / width;
    let d = TABLE_DIM as usize;
    entries
        .chunks(per)
        .enumerate()
        .map(|(i, chunk)| {
            let mut flat: Vec<f64> = chunk.iter().flatten().copied().collect();
            flat.resize(TABLE_CAPACITY, 0.0);
            let b = flat.split_off(d * (d + 1) / 2);
            StatsBlock {
                group: i as u64,
                target,
                dim: TABLE_DIM,
                a_upper: flat,
                b,
                sum_w: width as f64,
                sum_wyy: 0.0,
                n: chunk.len() as u64,
                landmark_s,
            }
        })
        .collect()
}

fn unpack(
    node: &str,
    target: u8,
    width: usize,
    blocks: &[&StatsBlock],
) -> Result<(Vec<Vec<f64>>, f64), FederationError> {
    let bad = |reason: String| FederationError::BadSlot {
        node: node.to_string(),
        reason,
    };
    let mut rows: Vec<&StatsBlock> = blocks.to_vec();
    rows.sort_by_key(|b| b.group);
    let mut out = Vec::new();
    let mut landmark = 0.0;
    for (i, blk) in rows.iter().enumerate() {
        let d = usize::from(blk.dim);
        let shape =
            blk.dim == TABLE_DIM && blk.a_upper.len() == d * (d + 1) / 2 && blk.b.len() == d;
        let n = usize::try_from(blk.n).unwrap_or(usize::MAX);
        if !shape
            || blk.group != i as u64
            || blk.sum_w != width as f64
            || n > TABLE_CAPACITY / width
        {
            return Err(bad(format!(
                "malformed table row {} of kind {target}",
                blk.group
            )));
        }
        if i > 0 && blk.landmark_s != landmark {
            return Err(bad(format!(
                "table rows of kind {target} disagree on the landmark"
            )));
        }
        landmark = blk.landmark_s;
        let flat: Vec<f64> = blk.a_upper.iter().chain(&blk.b).copied().collect();
        if !flat.iter().all(|v| v.is_finite()) {
            return Err(bad(format!("non-finite value in table kind {target}")));
        }
        out.extend(flat.chunks(width).take(n).map(<[f64]>::to_vec));
    }
    Ok((out, landmark))
}

impl FederationSlot {
    /// Encode the whole slot as plain statistics rows (see the module docs).
    pub fn to_blocks(&self) -> Vec<StatsBlock> {
        let mut out = self.blocks.clone();
        out.push(StatsBlock {
            group: 0,
            target: TARGET_META,
            dim: 1,
            a_upper: vec![self.tau_s],
            b: vec![self.exported_at_s],
            sum_w: 0.0,
            sum_wyy: 0.0,
            n: CODEC_VERSION,
            landmark_s: 0.0,
        });
        let labels: Vec<Vec<f64>> = self
            .label_times
            .iter()
            .filter(|l| l.last_at_s.is_finite())
            .map(|l| {
                let [h, lo] = split(l.group);
                vec![h, lo, f64::from(l.target), l.last_at_s]
            })
            .collect();
        out.extend(pack(TARGET_LABEL_TIMES, LABEL_WIDTH, &labels, 0.0));
        // Rebase every correction weight to one landmark (exact up to rounding).
        let valid: Vec<&CorrectionEntry> = self
            .corrections
            .iter()
            .filter(|c| c.landmark_s.is_finite() && c.last_label_s.is_finite())
            .collect();
        let lm = valid
            .iter()
            .map(|c| c.landmark_s)
            .fold(f64::NEG_INFINITY, f64::max);
        let lm = if lm.is_finite() { lm } else { 0.0 };
        let corr: Vec<Vec<f64>> = valid
            .iter()
            .map(|c| {
                let [rh, rl] = split(c.replica);
                let [ch, cl] = split(c.class);
                let w = c.weight * (-(lm - c.landmark_s) / self.tau_s).exp();
                vec![
                    rh,
                    rl,
                    ch,
                    cl,
                    f64::from(c.target),
                    c.c,
                    w,
                    c.labels as f64,
                    c.last_label_s,
                ]
            })
            .collect();
        out.extend(pack(TARGET_CORRECTIONS, CORRECTION_WIDTH, &corr, lm));
        out
    }

    /// Decode rows produced by [`FederationSlot::to_blocks`] for the slot of `node_id`.
    /// Malformed input is an error, never a panic; the result still goes through the
    /// learner's own validation when merged.
    pub fn from_blocks(
        node_id: &str,
        blocks: &[StatsBlock],
    ) -> Result<FederationSlot, FederationError> {
        let bad = |reason: &str| FederationError::BadSlot {
            node: node_id.to_string(),
            reason: reason.to_string(),
        };
        let metas: Vec<&StatsBlock> = blocks.iter().filter(|b| b.target == TARGET_META).collect();
        let [meta] = metas.as_slice() else {
            return Err(bad("expected exactly one meta row"));
        };
        if meta.n != CODEC_VERSION || meta.a_upper.len() != 1 || meta.b.len() != 1 {
            return Err(bad("unsupported or malformed meta row"));
        }
        let (tau_s, exported_at_s) = (meta.a_upper[0], meta.b[0]);
        if !(tau_s.is_finite() && tau_s > 0.0 && exported_at_s.is_finite()) {
            return Err(bad("meta row has an invalid tau or export time"));
        }
        let kind = |t: u8| {
            blocks
                .iter()
                .filter(move |b| b.target == t)
                .collect::<Vec<_>>()
        };
        if let Some(b) = blocks.iter().find(|b| {
            ![
                TARGET_TTFT,
                TARGET_TPOT,
                TARGET_META,
                TARGET_LABEL_TIMES,
                TARGET_CORRECTIONS,
            ]
            .contains(&b.target)
        }) {
            return Err(bad(&format!("unknown row kind {}", b.target)));
        }
        let (label_rows, _) = unpack(
            node_id,
            TARGET_LABEL_TIMES,
            LABEL_WIDTH,
            &kind(TARGET_LABEL_TIMES),
        )?;
        let mut label_times = Vec::with_capacity(label_rows.len());
        for r in label_rows {
            let group = join(r[0], r[1]).ok_or_else(|| bad("bad group id in label times"))?;
            let target = match r[2] {
                0.0 => TARGET_TTFT,
                1.0 => TARGET_TPOT,
                _ => return Err(bad("bad target in label times")),
            };
            label_times.push(LabelTime {
                group,
                target,
                last_at_s: r[3],
            });
        }
        let (corr_rows, landmark_s) = unpack(
            node_id,
            TARGET_CORRECTIONS,
            CORRECTION_WIDTH,
            &kind(TARGET_CORRECTIONS),
        )?;
        let mut corrections = Vec::with_capacity(corr_rows.len());
        for r in corr_rows {
            let replica = join(r[0], r[1]).ok_or_else(|| bad("bad replica id in corrections"))?;
            let class = join(r[2], r[3]).ok_or_else(|| bad("bad class id in corrections"))?;
            let target = match r[4] {
                0.0 => TARGET_TTFT,
                1.0 => TARGET_TPOT,
                _ => return Err(bad("bad target in corrections")),
            };
            if !(r[6] >= 0.0 && r[7] >= 0.0 && r[7].fract() == 0.0) {
                return Err(bad("bad weight or label count in corrections"));
            }
            corrections.push(CorrectionEntry {
                replica,
                class,
                target,
                c: r[5],
                weight: r[6],
                landmark_s,
                labels: r[7] as u64,
                last_label_s: r[8],
            });
        }
        Ok(FederationSlot {
            node_id: node_id.to_string(),
            exported_at_s,
            tau_s,
            blocks: blocks
                .iter()
                .filter(|b| b.target == TARGET_TTFT || b.target == TARGET_TPOT)
                .cloned()
                .collect(),
            label_times,
            corrections,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_split_and_join_exactly() {
        for id in [0, 1, u64::from(u32::MAX), u64::MAX, 0xdead_beef_cafe_f00d] {
            let [h, l] = split(id);
            assert_eq!(join(h, l), Some(id));
        }
        assert_eq!(join(0.5, 0.0), None);
        assert_eq!(join(-1.0, 0.0), None);
        assert_eq!(join(4_294_967_296.0, 0.0), None);
    }
}
