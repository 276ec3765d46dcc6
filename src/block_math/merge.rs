//! Finishing and combining partial attention results, in the numerically stable forms.

use super::parts::{Partial, RunningState};
use rayon::prelude::*;

/// O = acc / l and LSE = m + ln l per row; a row that saw no key gets O = 0 and LSE = −∞, the
/// identity of `merge`.
pub fn finalize(head_dim: usize, state: RunningState<Vec<f32>>) -> Partial<Vec<f32>> {
    let RunningState { m, l, mut acc } = state;
    let lse: Vec<f32> = m
        .iter()
        .zip(&l)
        .map(|(&m, &l)| {
            if l > 0.0 {
                m + l.ln()
            } else {
                f32::NEG_INFINITY
            }
        })
        .collect();
    acc.par_chunks_mut(head_dim)
        .zip(l.par_iter())
        .for_each(|(row, &l)| {
            let inv = if l > 0.0 { 1.0 / l } else { 0.0 };
            row.iter_mut().for_each(|x| *x *= inv);
        });
    Partial { out: acc, lse }
}

/// Merges partial `b` into `a` (same rows, disjoint keys):
/// LSE = ln(e^{LSE_a} + e^{LSE_b}), O = e^{LSE_a − LSE}·O_a + e^{LSE_b − LSE}·O_b,
/// written around the larger LSE so neither exponential overflows, and with −∞ (no keys) as
/// the identity so fully masked rows stay exactly zero.
pub fn merge(head_dim: usize, a: &mut Partial<Vec<f32>>, b: &Partial<Vec<f32>>) {
    a.out
        .par_chunks_mut(head_dim)
        .zip(a.lse.par_iter_mut())
        .zip(b.out.par_chunks(head_dim).zip(b.lse.par_iter()))
        .for_each(|((oa, la), (ob, &lb))| {
            let hi = la.max(lb);
            if hi == f32::NEG_INFINITY {
                return; // neither side saw a key
            }
            let (wa, wb) = ((*la - hi).exp(), (lb - hi).exp());
            let sum = wa + wb;
            *la = hi + sum.ln();
            let (wa, wb) = (wa / sum, wb / sum);
            oa.iter_mut()
                .zip(ob)
                .for_each(|(x, &y)| *x = wa * *x + wb * y);
        });
}

/// D = rowsum(dO ∘ O), one value per query row: the softmax-backward constant.
pub fn delta(head_dim: usize, out: &[f32], dout: &[f32]) -> Vec<f32> {
    out.par_chunks(head_dim)
        .zip(dout.par_chunks(head_dim))
        .map(|(o, g)| o.iter().zip(g).map(|(a, b)| a * b).sum())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block_math::{Block, forward_block};
    use crate::shape::{Dims, Mask, Span};

    /// The merge rule in f64, straight from the definition (shifted by the max to stay finite).
    fn merge_f64(oa: f64, la: f64, ob: f64, lb: f64) -> (f64, f64) {
        let hi = la.max(lb);
        let lse = hi + ((la - hi).exp() + (lb - hi).exp()).ln();
        ((la - lse).exp() * oa + (lb - lse).exp() * ob, lse)
    }

    #[test]
    fn merge_is_stable_with_lse_far_apart() {
        let d = 3;
        let lses = [
            (1e4, -1e4),
            (-1e4, 1e4),
            (1e4, 1e4 + 0.5),
            (-1e4, -1e4 - 2.0),
            (0.0, 30.0),
        ];
        for (la, lb) in lses {
            let oa = vec![0.25, -1.0, 3.0];
            let ob = vec![-0.5, 2.0, 1.0];
            let mut a = Partial {
                out: oa.clone(),
                lse: vec![la],
            };
            merge(
                d,
                &mut a,
                &Partial {
                    out: ob.clone(),
                    lse: vec![lb],
                },
            );
            let (_, want_lse) = merge_f64(0.0, la as f64, 0.0, lb as f64);
            assert!(
                (a.lse[0] as f64 - want_lse).abs() <= 1e-6 * want_lse.abs().max(1.0),
                "{la} {lb}"
            );
            for c in 0..d {
                let (want, _) = merge_f64(oa[c] as f64, la as f64, ob[c] as f64, lb as f64);
                assert!(
                    (a.out[c] as f64 - want).abs() < 1e-6,
                    "{la} {lb}: {} vs {want}",
                    a.out[c]
                );
            }
        }
    }

    #[test]
    fn fully_masked_rows_are_the_identity_of_merge() {
        let some = Partial {
            out: vec![1.5, -2.0],
            lse: vec![0.75],
        };
        let none = Partial {
            out: vec![0.0, 0.0],
            lse: vec![f32::NEG_INFINITY],
        };
        let mut a = none.clone();
        merge(2, &mut a, &some);
        assert_eq!((a.out, a.lse), (some.out.clone(), some.lse.clone()));
        let mut b = some.clone();
        merge(2, &mut b, &none);
        assert_eq!((b.out, b.lse), (some.out.clone(), some.lse.clone()));
        let mut c = none.clone();
        merge(2, &mut c, &none);
        assert_eq!(c.out, vec![0.0, 0.0]);
        assert_eq!(c.lse, vec![f32::NEG_INFINITY]);
    }

    #[test]
    fn a_block_entirely_in_the_future_leaves_rows_fully_masked() {
        let dims = Dims {
            batch: 1,
            heads: 2,
            kv_heads: 1,
            head_dim: 4,
        };
        let block = Block {
            q: Span { start: 0, len: 3 },
            kv: Span { start: 3, len: 5 },
        };
        let mut state = crate::block_math::RunningState {
            m: vec![f32::NEG_INFINITY; dims.stat_len(3)],
            l: vec![0.0; dims.stat_len(3)],
            acc: vec![0.0; dims.q_len(3)],
        };
        let q = vec![1.0; dims.q_len(3)];
        let kv = vec![1.0; dims.kv_len(5)];
        forward_block(&dims, block, &Mask::causal(), &q, &kv, &kv, &mut state);
        let p = finalize(4, state);
        assert!(p.lse.iter().all(|&l| l == f32::NEG_INFINITY));
        assert!(p.out.iter().all(|&o| o == 0.0));
    }

    #[test]
    fn delta_is_the_row_dot_product() {
        let out = [1.0, 2.0, 3.0, -1.0, 0.5, 2.0];
        let dout = [0.5, 0.5, 1.0, 2.0, 2.0, -1.0];
        assert_eq!(delta(3, &out, &dout), vec![4.5, -3.0]);
    }
}
