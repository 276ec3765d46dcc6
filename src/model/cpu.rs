//! The CPU implementation of `Ops`: host vectors of f32 (training) or f64 (gradient checks),
//! matrix products through `ndarray` on row blocks spread over rayon tasks. It is the spec the
//! GPU implementation is checked against.

use super::float::Float;
use super::init;
use super::ops::{
    AdamState, AdamStep, AdamW, LinearBackward, LossInput, LossOut, NormBackward, Ops, RopeCall,
    Rows, check_rows, row_positions,
};
use anyhow::{Result, bail};
use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewMut2, s};
use rayon::prelude::*;
use std::marker::PhantomData;

/// Rows per rayon task in matrix products: big enough for efficient kernels.
const ROW_BLOCK: usize = 64;
/// Rows whose logits exist at once in the loss.
const LOSS_ROWS: usize = 64;

/// Model ops on the CPU in precision `F`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu<F>(PhantomData<F>);

impl<F> Cpu<F> {
    pub fn new() -> Self {
        Cpu(PhantomData)
    }
}

fn view<F>(data: &[F], rows: usize, cols: usize) -> ArrayView2<'_, F> {
    ArrayView2::from_shape((rows, cols), data).expect("row-major shape")
}

fn view_mut<F>(data: &mut [F], rows: usize, cols: usize) -> ArrayViewMut2<'_, F> {
    ArrayViewMut2::from_shape((rows, cols), data).expect("row-major shape")
}

fn check_len<F>(what: &str, t: &[F], want: usize) -> Result<()> {
    if t.len() != want {
        bail!("{what} has {} elements where {want} were expected", t.len());
    }
    Ok(())
}

/// out (+)= a b (a `[rows, k]`, b `[k, n]` given as a view, possibly transposed), split into
/// row blocks over rayon tasks.
fn gemm_rows<F: Float>(a: &[F], b: ArrayView2<'_, F>, rows: usize, beta: F, out: &mut [F]) {
    let (k, n) = b.dim();
    out.par_chunks_mut(ROW_BLOCK * n)
        .zip(a.par_chunks(ROW_BLOCK * k))
        .for_each(|(o, a)| {
            let r = a.len() / k;
            general_mat_mul(F::one(), &view(a, r, k), &b, beta, &mut view_mut(o, r, n));
        });
    debug_assert_eq!(out.len(), rows * n);
}

/// dw (`[out, inp]`) = dyᵀ x + beta·dw, split over blocks of output rows.
fn gemm_weight_grad<F: Float>(
    dy: &[F],
    x: &[F],
    (rows, inp, out): (usize, usize, usize),
    beta: F,
    dw: &mut [F],
) {
    let dy = view(dy, rows, out);
    let x = view(x, rows, inp);
    dw.par_chunks_mut(ROW_BLOCK * inp)
        .enumerate()
        .for_each(|(i, w)| {
            let o0 = i * ROW_BLOCK;
            let n = w.len() / inp;
            let dyt = dy.slice(s![.., o0..o0 + n]);
            general_mat_mul(F::one(), &dyt.t(), &x, beta, &mut view_mut(w, n, inp));
        });
}

fn sigmoid<F: Float>(x: F) -> F {
    F::one() / (F::one() + (-x).exp())
}

impl<F: Float> Ops for Cpu<F> {
    type T = Vec<F>;

    fn upload(&self, host: &[f32]) -> Result<Vec<F>> {
        Ok(host.iter().map(|&x| F::of(x as f64)).collect())
    }

    fn download(&self, t: &Vec<F>) -> Result<Vec<f32>> {
        Ok(t.iter().map(|x| x.f64() as f32).collect())
    }

    /// A separate host buffer: the copy out and back run the schedule a GPU runs, so the CPU
    /// tests its logic.
    type Host = Box<[F]>;

    fn stash(&self, t: &Vec<F>) -> Result<Box<[F]>> {
        Ok(t.as_slice().into())
    }

    fn stash_into(&self, t: &Vec<F>, h: &mut Box<[F]>) -> Result<()> {
        if t.len() != h.len() {
            bail!(
                "a tensor of {} elements cannot be stashed over the stash of one of {}",
                t.len(),
                h.len()
            );
        }
        h.copy_from_slice(t);
        Ok(())
    }

    fn fetch(&self, h: &Box<[F]>) -> Result<Vec<F>> {
        Ok(h.to_vec())
    }

    /// Copies on the host are done when they return.
    fn await_fetches(&self) -> Result<()> {
        Ok(())
    }

    fn zeros(&self, len: usize) -> Result<Vec<F>> {
        Ok(vec![F::zero(); len])
    }

    /// NaN: a read before the first write poisons every result it reaches, so the CPU tests
    /// catch a `dx_empty` that is wrong, where the GPU would read whatever the memory held.
    fn scratch(&self, len: usize) -> Result<Vec<F>> {
        Ok(vec![F::nan(); len])
    }

    /// Activations are `F` here too.
    fn activation_zeros(&self, len: usize) -> Result<Vec<F>> {
        self.zeros(len)
    }

    fn random_uniform(&self, len: usize, key: u64, offset: u64, amp: f32) -> Result<Vec<F>> {
        let step = init::step(amp);
        Ok((0..len as u64)
            .into_par_iter()
            .map(|i| F::of(init::uniform(key, offset + i, step) as f64))
            .collect())
    }

    fn len(&self, t: &Vec<F>) -> usize {
        t.len()
    }

    fn elem_bytes(&self) -> usize {
        std::mem::size_of::<F>()
    }

    fn rows(&self, t: &Vec<F>, width: usize, start: usize, len: usize) -> Result<Vec<F>> {
        check_rows(t.len(), width, start, len)?;
        Ok(t[start * width..(start + len) * width].to_vec())
    }

    fn set_rows(&self, dst: &mut Vec<F>, width: usize, start: usize, src: &Vec<F>) -> Result<()> {
        let len = src.len() / width.max(1);
        check_rows(dst.len(), width, start, len)?;
        check_len("rows to write", src, len * width)?;
        dst[start * width..(start + len) * width].copy_from_slice(src);
        Ok(())
    }

    fn join(&self, parts: &[Vec<F>]) -> Result<Vec<F>> {
        Ok(parts.concat())
    }

    fn add_assign(&self, dst: &mut Vec<F>, src: &Vec<F>) -> Result<()> {
        check_len("an added tensor", src, dst.len())?;
        dst.par_iter_mut().zip(src).for_each(|(a, &b)| *a += b);
        Ok(())
    }

    fn sum_squares(&self, ts: &[&Vec<F>]) -> Result<f64> {
        Ok(ts
            .iter()
            .flat_map(|t| t.iter())
            .map(|x| x.f64() * x.f64())
            .sum())
    }

    fn embed(&self, table: &Vec<F>, tokens: &[u32], dim: usize) -> Result<Vec<F>> {
        let vocab = table.len() / dim;
        let mut out = Vec::with_capacity(tokens.len() * dim);
        for &t in tokens {
            let t = t as usize;
            if t >= vocab {
                bail!("token {t} is outside the vocabulary of {vocab}");
            }
            out.extend_from_slice(&table[t * dim..(t + 1) * dim]);
        }
        Ok(out)
    }

    fn embed_backward(
        &self,
        dtable: &mut Vec<F>,
        tokens: &[u32],
        dy: &Vec<F>,
        dim: usize,
    ) -> Result<()> {
        check_len("the embedding gradient", dy, tokens.len() * dim)?;
        for (r, &t) in tokens.iter().enumerate() {
            let row = &mut dtable[t as usize * dim..(t as usize + 1) * dim];
            row.iter_mut()
                .zip(&dy[r * dim..(r + 1) * dim])
                .for_each(|(a, &b)| *a += b);
        }
        Ok(())
    }

    fn linear(
        &self,
        x: Rows<&Vec<F>>,
        w: &Vec<F>,
        rows: usize,
        inp: usize,
        out: usize,
    ) -> Result<Vec<F>> {
        let x = &x.t[x.range(x.t.len(), rows, inp, "a linear layer's input")?];
        check_len("a linear layer's weight", w, out * inp)?;
        let mut y = vec![F::zero(); rows * out];
        gemm_rows(x, view(w, out, inp).t(), rows, F::zero(), &mut y);
        Ok(y)
    }

    fn linear_add(
        &self,
        x: &Vec<F>,
        w: &Vec<F>,
        y: Rows<&mut Vec<F>>,
        rows: usize,
        inp: usize,
        out: usize,
    ) -> Result<()> {
        check_len("a linear layer's input", x, rows * inp)?;
        check_len("a linear layer's weight", w, out * inp)?;
        let range = y.range(y.t.len(), rows, out, "a residual stream")?;
        gemm_rows(x, view(w, out, inp).t(), rows, F::one(), &mut y.t[range]);
        Ok(())
    }

    fn linear_backward(
        &self,
        operands: LinearBackward<'_, Vec<F>>,
        dx: Rows<&mut Vec<F>>,
        dw: &mut Vec<F>,
    ) -> Result<()> {
        let LinearBackward {
            dy,
            x,
            w,
            rows,
            inp,
            out,
            dx_empty,
            dw_empty,
        } = operands;
        let dy = &dy.t[dy.range(dy.t.len(), rows, out, "a linear layer's output gradient")?];
        let x = &x.t[x.range(x.t.len(), rows, inp, "a linear layer's input")?];
        check_len("a linear layer's weight", w, out * inp)?;
        let range = dx.range(dx.t.len(), rows, inp, "a linear layer's input gradient")?;
        check_len("a linear layer's weight gradient", dw, out * inp)?;
        let beta = if dx_empty { F::zero() } else { F::one() };
        gemm_rows(dy, view(w, out, inp), rows, beta, &mut dx.t[range]);
        let beta = if dw_empty { F::zero() } else { F::one() };
        gemm_weight_grad(dy, x, (rows, inp, out), beta, dw);
        Ok(())
    }

    fn bias_add(&self, y: &mut Vec<F>, b: &Vec<F>, rows: usize, width: usize) -> Result<()> {
        check_len("a biased projection", y, rows * width)?;
        check_len("a bias", b, width)?;
        y.par_chunks_mut(width.max(1))
            .for_each(|r| r.iter_mut().zip(b).for_each(|(v, &c)| *v += c));
        Ok(())
    }

    fn bias_backward(&self, dy: &Vec<F>, rows: usize, width: usize, db: &mut Vec<F>) -> Result<()> {
        check_len("a biased projection's gradient", dy, rows * width)?;
        check_len("a bias gradient", db, width)?;
        // Summed in f64 whatever F is: at long sequences an f32 running sum over rows loses
        // digits.
        let mut sum = vec![0.0f64; width];
        for r in dy.chunks(width.max(1)) {
            sum.iter_mut().zip(r).for_each(|(s, v)| *s += v.f64());
        }
        db.iter_mut().zip(sum).for_each(|(d, s)| *d += F::of(s));
        Ok(())
    }

    fn rmsnorm(
        &self,
        x: &Vec<F>,
        w: &Vec<F>,
        rows: usize,
        dim: usize,
        eps: f64,
    ) -> Result<(Vec<F>, Vec<F>)> {
        check_len("a norm's input", x, rows * dim)?;
        check_len("a norm's gain", w, dim)?;
        let rstd: Vec<F> = x
            .par_chunks(dim)
            .map(|r| {
                let ms = r.iter().fold(F::zero(), |a, &v| a + v * v) / F::of(dim as f64);
                F::one() / (ms + F::of(eps)).sqrt()
            })
            .collect();
        let mut y = x.clone();
        y.par_chunks_mut(dim).zip(&rstd).for_each(|(r, &s)| {
            r.iter_mut().zip(w).for_each(|(v, &g)| *v = *v * s * g);
        });
        Ok((y, rstd))
    }

    fn rmsnorm_backward(
        &self,
        operands: NormBackward<'_, Vec<F>>,
        dx: &mut Vec<F>,
        dw: &mut Vec<F>,
    ) -> Result<()> {
        let NormBackward {
            x,
            w,
            rstd,
            dy,
            rows,
            dim,
        } = operands;
        check_len("a norm's output gradient", dy, rows * dim)?;
        check_len("a norm's input", x, rows * dim)?;
        check_len("a norm's input gradient", dx, rows * dim)?;
        check_len("a norm's gain gradient", dw, dim)?;
        dx.par_chunks_mut(dim)
            .zip(x.par_chunks(dim).zip(dy.par_chunks(dim)))
            .zip(rstd.par_iter())
            .for_each(|((dx, (x, dy)), &s)| {
                let dot = (0..dim).fold(F::zero(), |a, i| a + dy[i] * w[i] * x[i]);
                let c = s * s * dot / F::of(dim as f64);
                for i in 0..dim {
                    dx[i] += s * (dy[i] * w[i] - x[i] * c);
                }
            });
        for ((x, dy), &s) in x.chunks(dim).zip(dy.chunks(dim)).zip(rstd) {
            for i in 0..dim {
                dw[i] += dy[i] * x[i] * s;
            }
        }
        Ok(())
    }

    fn rope(&self, x: &mut Vec<F>, call: RopeCall<'_>) -> Result<()> {
        let RopeCall {
            rows,
            heads,
            head_dim,
            positions,
            rotary,
            inverse,
        } = call;
        check_len("a rotary input", x, rows * heads * head_dim)?;
        let positions: Vec<usize> = row_positions(positions, rows)?.collect();
        if !head_dim.is_multiple_of(2) {
            bail!("rotary embeddings need an even head dim, not {head_dim}");
        }
        let half = head_dim / 2;
        check_len("the rotary frequencies", &rotary.inv_freq, half)?;
        let sign = if inverse { -1.0 } else { 1.0 };
        let scale = F::of(rotary.scale as f64);
        x.par_chunks_mut(heads * head_dim)
            .enumerate()
            .for_each(|(r, row)| {
                let pos = positions[r] as f32;
                let (cos, sin): (Vec<F>, Vec<F>) = rotary
                    .inv_freq
                    .iter()
                    .map(|&f| {
                        let a = (pos * f) as f64;
                        (F::of(a.cos()) * scale, F::of(sign * a.sin()) * scale)
                    })
                    .unzip();
                for h in row.chunks_mut(head_dim) {
                    for i in 0..half {
                        let (a, b) = (h[i], h[i + half]);
                        h[i] = a * cos[i] - b * sin[i];
                        h[i + half] = b * cos[i] + a * sin[i];
                    }
                }
            });
        Ok(())
    }

    fn swiglu(&self, g: &Vec<F>, u: &Vec<F>) -> Result<Vec<F>> {
        check_len("the up projection", u, g.len())?;
        Ok(g.par_iter()
            .zip(u)
            .map(|(&g, &u)| g * sigmoid(g) * u)
            .collect())
    }

    fn swiglu_backward(&self, g: &Vec<F>, u: &Vec<F>, dm: &Vec<F>) -> Result<(Vec<F>, Vec<F>)> {
        check_len("the MLP gradient", dm, g.len())?;
        Ok(g.par_iter()
            .zip(u)
            .zip(dm)
            .map(|((&g, &u), &dm)| {
                let s = sigmoid(g);
                (dm * u * s * (F::one() + g * (F::one() - s)), dm * g * s)
            })
            .unzip())
    }

    fn cross_entropy(
        &self,
        input: LossInput<'_, Vec<F>>,
        dw: &mut Vec<F>,
    ) -> Result<LossOut<Vec<F>>> {
        let LossInput {
            h,
            w,
            targets,
            dim,
            vocab,
            scale,
        } = input;
        let rows = targets.len();
        check_len("the final hidden states", h, rows * dim)?;
        check_len("the output projection", w, vocab * dim)?;
        check_len("the output projection's gradient", dw, vocab * dim)?;
        if let Some(&t) = targets.iter().find(|&&t| t as usize >= vocab) {
            bail!("target token {t} is outside the vocabulary of {vocab}");
        }
        let mut dh = vec![F::zero(); rows * dim];
        let mut loss_sum = 0.0;
        let mut argmax = Vec::with_capacity(rows);
        let mut logits = vec![F::zero(); LOSS_ROWS.min(rows) * vocab];
        let wt = view(w, vocab, dim);
        for r0 in (0..rows).step_by(LOSS_ROWS) {
            let n = LOSS_ROWS.min(rows - r0);
            let hc = &h[r0 * dim..(r0 + n) * dim];
            let lg = &mut logits[..n * vocab];
            gemm_rows(hc, wt.t(), n, F::zero(), lg);
            // Softmax minus one-hot, times the scale: the gradient of the logits, in place.
            let stats: Vec<(f64, u32)> = lg
                .par_chunks_mut(vocab)
                .zip(&targets[r0..r0 + n])
                .map(|(row, &t)| {
                    let (best, max) =
                        row.iter()
                            .enumerate()
                            .fold((0, F::neg_infinity()), |(bi, bm), (i, &v)| {
                                if v > bm { (i, v) } else { (bi, bm) }
                            });
                    let sum = row.iter().fold(F::zero(), |a, &v| a + (v - max).exp());
                    let lse = max + sum.ln();
                    let loss = (lse - row[t as usize]).f64();
                    let sc = F::of(scale);
                    row.iter_mut().for_each(|v| *v = (*v - lse).exp() * sc);
                    row[t as usize] -= sc;
                    (loss, best as u32)
                })
                .collect();
            for (l, a) in stats {
                loss_sum += l;
                argmax.push(a);
            }
            gemm_rows(lg, wt, n, F::zero(), &mut dh[r0 * dim..(r0 + n) * dim]);
            gemm_weight_grad(lg, hc, (n, dim, vocab), F::one(), dw);
        }
        Ok(LossOut {
            loss_sum,
            argmax,
            dh,
        })
    }

    fn adamw(
        &self,
        param: &mut Vec<F>,
        grad: &Vec<F>,
        state: AdamState<&mut Vec<F>>,
        hp: &AdamW,
        at: AdamStep,
        decay: bool,
    ) -> Result<()> {
        let (len, step) = (param.len(), at.step);
        check_len("a gradient", grad, len)?;
        check_len("AdamW's first moment", state.m, len)?;
        check_len("AdamW's second moment", state.v, len)?;
        let (b1, b2) = (hp.beta1, hp.beta2);
        let c1 = 1.0 - b1.powi(step as i32);
        let c2 = 1.0 - b2.powi(step as i32);
        let wd = if decay { hp.weight_decay } else { 0.0 };
        let [b1, b2, c1, c2, lr, eps, wd, scale] =
            [b1, b2, c1, c2, hp.lr, hp.eps, wd, at.grad_scale].map(F::of);
        // With a master the update is the master's and the parameter its copy (the CPU's
        // parameters are already exact, so the rounding is the identity).
        let (updated, copy) = match state.master {
            Some(master) => {
                check_len("the master copy", master, len)?;
                (master, Some(param))
            }
            None => (param, None),
        };
        updated
            .par_iter_mut()
            .zip(grad)
            .zip(state.m.par_iter_mut().zip(state.v.par_iter_mut()))
            .for_each(|((p, &g), (m, v))| {
                let g = g * scale;
                *m = b1 * *m + (F::one() - b1) * g;
                *v = b2 * *v + (F::one() - b2) * g * g;
                let update = (*m / c1) / ((*v / c2).sqrt() + eps);
                *p = *p - lr * (update + wd * *p);
            });
        if let Some(param) = copy {
            param.copy_from_slice(updated);
        }
        Ok(())
    }
}
