//! Paged MLA against a contiguous f64 reference: page sizes 1, 4 and 16, ragged lengths, 1, 3,
//! 16 and 20 heads (two head chunks), latent ranks 40, 64 and 512, positional dims 7, 16 and 64,
//! causal or not, split or not; equal to composing the MLA pieces; and its errors.

use crate::common::*;
use ruda_ops::api::{self, OpError};
use ruda_ops::paged_attention::mla::{mla_workspace_len, paged_mla_forward, MlaPlanView};
use ruda_runtime::{DType, Device, Tensor};

/// A schedule over a shuffled page pool: per sequence its table and length, per query its
/// sequence and position.
struct Schedule {
    page_size: usize,
    pages: usize,
    tables: Vec<Vec<u32>>,
    lengths: Vec<usize>,
    queries: Vec<(usize, usize)>,
}

impl Schedule {
    /// `lengths` sequences; `new` queries at the end of each (decode: 1).
    fn new(rng: &mut Rng, page_size: usize, lengths: &[usize], new: usize) -> Schedule {
        let need: usize = lengths.iter().map(|l| l.div_ceil(page_size)).sum();
        let pages = need + 3;
        let mut pool: Vec<u32> = (0..pages as u32).collect();
        for i in (1..pool.len()).rev() {
            pool.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
        }
        let mut tables = Vec::new();
        let mut queries = Vec::new();
        for (s, &len) in lengths.iter().enumerate() {
            let n = len.div_ceil(page_size);
            tables.push(pool.drain(..n).collect());
            for p in len.saturating_sub(new)..len {
                queries.push((s, p));
            }
        }
        Schedule { page_size, pages, tables, lengths: lengths.to_vec(), queries }
    }

    fn max_length(&self) -> usize {
        self.lengths.iter().copied().max().unwrap_or(0)
    }

    /// The device plan buffers (tables padded with page 0 to the longest).
    fn upload(&self, dev: &Device) -> [Tensor; 4] {
        let width = self.tables.iter().map(Vec::len).max().unwrap_or(1).max(1);
        let mut flat = Vec::new();
        for t in &self.tables {
            flat.extend(t.iter().copied().chain(std::iter::repeat(0)).take(width));
        }
        let u = |v: Vec<u32>, shape: &[usize]| Tensor::from_slice(dev, &v, shape).unwrap();
        let n = self.queries.len();
        [
            u(flat, &[self.tables.len(), width]),
            u(self.lengths.iter().map(|&l| l as u32).collect(), &[self.lengths.len()]),
            u(self.queries.iter().map(|q| q.0 as u32).collect(), &[n]),
            u(self.queries.iter().map(|q| q.1 as u32).collect(), &[n]),
        ]
    }

    /// The physical row of key `j` of sequence `s`.
    fn row(&self, s: usize, j: usize) -> usize {
        self.tables[s][j / self.page_size] as usize * self.page_size + j % self.page_size
    }
}

struct Inputs {
    q: Vec<f32>,
    qp: Vec<f32>,
    latent: Vec<f32>,
    kp: Vec<f32>,
}

/// The f64 reference `[queries, H, R]`.
fn reference(sc: &Schedule, x: &Inputs, h: usize, r: usize, p: usize, scale: f64, causal: bool) -> Vec<f64> {
    let mut out = vec![0.0; sc.queries.len() * h * r];
    for (qi, &(s, pos)) in sc.queries.iter().enumerate() {
        let end = if causal { pos + 1 } else { sc.lengths[s] };
        for hh in 0..h {
            let qa = &x.q[(qi * h + hh) * r..][..r];
            let qb = &x.qp[(qi * h + hh) * p..][..p];
            let scores: Vec<f64> = (0..end)
                .map(|j| {
                    let row = sc.row(s, j);
                    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(u, v)| *u as f64 * *v as f64).sum::<f64>();
                    scale * (dot(qa, &x.latent[row * r..][..r]) + dot(qb, &x.kp[row * p..][..p]))
                })
                .collect();
            let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|v| (v - m).exp()).collect();
            let total: f64 = w.iter().sum();
            let o = &mut out[(qi * h + hh) * r..][..r];
            for (j, wj) in w.iter().enumerate() {
                let row = sc.row(s, j);
                for (k, ok) in o.iter_mut().enumerate() {
                    *ok += wj / total * x.latent[row * r + k] as f64;
                }
            }
        }
    }
    out
}

struct Case {
    dtype: DType,
    page_size: usize,
    lengths: &'static [usize],
    new: usize,
    heads: usize,
    rank: usize,
    pos_dim: usize,
    causal: bool,
    splits: Option<usize>,
}

fn run(dev: &Device, rng: &mut Rng, c: &Case) {
    let sc = Schedule::new(rng, c.page_size, c.lengths, c.new);
    let (n, h, r, p, dt) = (sc.queries.len(), c.heads, c.rank, c.pos_dim, c.dtype);
    let rows = sc.pages * sc.page_size;
    let x = Inputs {
        q: quantize(dt, &rng.vec(n * h * r, -1.0, 1.0)),
        qp: quantize(dt, &rng.vec(n * h * p, -1.0, 1.0)),
        latent: quantize(dt, &rng.vec(rows * r, -1.0, 1.0)),
        kp: quantize(dt, &rng.vec(rows * p, -1.0, 1.0)),
    };
    let scale = 0.6 / ((r + p) as f32).sqrt();
    let [tables, lengths, sequence_ids, positions] = sc.upload(dev);
    let plan = MlaPlanView {
        tables: &tables,
        lengths: &lengths,
        sequence_ids: &sequence_ids,
        positions: &positions,
        page_size: sc.page_size,
        max_length: sc.max_length(),
    };
    let ws = c.splits.map(|s| (Tensor::zeros(dev, DType::F32, &[mla_workspace_len(n, h, r, s)]).unwrap(), s));
    let got = paged_mla_forward(
        &plan,
        &tensor(dev, dt, &x.q, &[n, h, r]),
        &tensor(dev, dt, &x.qp, &[n, h, p]),
        &tensor(dev, dt, &x.latent, &[sc.pages, sc.page_size, 1, r]),
        &tensor(dev, dt, &x.kp, &[sc.pages, sc.page_size, 1, p]),
        scale,
        c.causal,
        ws.as_ref().map(|(t, s)| (t, *s)),
    )
    .unwrap();
    let want = reference(&sc, &x, h, r, p, scale as f64, c.causal);
    let what = format!(
        "paged_mla {dt} page_size={} lengths={:?} new={} H={h} R={r} P={p} causal={} splits={:?}",
        c.page_size, c.lengths, c.new, c.causal, c.splits
    );
    assert_close(&what, &got.to_f32_vec().unwrap(), &want, 2e-5 + epsilon(dt), 0.0);
}

#[test]
fn paged_mla_matches_the_contiguous_reference() {
    let dev = device();
    let mut rng = Rng::new(1414);
    let f32 = DType::F32;
    let cases = [
        // Decode over ragged lengths, every page size, split and not.
        (f32, 1, &[5, 1, 9][..], 1, 3, 64, 16, true, None),
        (f32, 4, &[13, 2, 7], 1, 3, 64, 16, true, Some(2)),
        (f32, 16, &[20, 3], 1, 16, 512, 64, false, None),
        (f32, 4, &[9, 17], 1, 16, 512, 16, true, Some(4)),
        (DType::F16, 4, &[11, 6], 1, 1, 64, 64, true, Some(3)),
        (DType::BF16, 16, &[18, 5], 1, 3, 64, 16, false, None),
        // Prefill chunks: several queries per sequence, causal and not.
        (f32, 4, &[10, 6], 4, 3, 64, 16, true, None),
        (f32, 1, &[7, 3], 3, 1, 64, 64, false, Some(2)),
        (DType::BF16, 16, &[19, 4], 3, 16, 64, 16, true, Some(2)),
        // More heads than a block holds at R = 512 (two head chunks, the second partial), and
        // ranks and positional dims that are not multiples of a warp.
        (f32, 4, &[6, 3], 1, 20, 512, 16, true, Some(2)),
        (f32, 4, &[8, 5], 2, 3, 40, 7, false, None),
    ];
    for (dtype, page_size, lengths, new, heads, rank, pos_dim, causal, splits) in cases {
        let c = Case { dtype, page_size, lengths, new, heads, rank, pos_dim, causal, splits };
        run(&dev, &mut rng, &c);
    }
}

#[test]
fn paged_mla_equals_the_composed_pieces() {
    // One sequence of 9 keys over pages of 4, three causal queries at its end: gather its
    // latents contiguously, mla_scores, a causal softmax here, mla_value_product.
    let dev = device();
    let mut rng = Rng::new(77);
    let (h, r, p, ps) = (3, 64, 16, 4);
    let sc = Schedule::new(&mut rng, ps, &[9], 3);
    let rows = sc.pages * ps;
    let (n, s) = (sc.queries.len(), 9);
    let q = rng.vec(n * h * r, -1.0, 1.0);
    let qp = rng.vec(n * h * p, -1.0, 1.0);
    let latent = rng.vec(rows * r, -1.0, 1.0);
    let kp = rng.vec(rows * p, -1.0, 1.0);
    let scale = 0.1;
    let [tables, lengths, sequence_ids, positions] = sc.upload(&dev);
    let plan = MlaPlanView {
        tables: &tables,
        lengths: &lengths,
        sequence_ids: &sequence_ids,
        positions: &positions,
        page_size: ps,
        max_length: s,
    };
    let f = |v: &[f32], shape: &[usize]| tensor(&dev, DType::F32, v, shape);
    let (qt, qpt) = (f(&q, &[n, h, r]), f(&qp, &[n, h, p]));
    let paged = paged_mla_forward(
        &plan,
        &qt,
        &qpt,
        &f(&latent, &[sc.pages, ps, 1, r]),
        &f(&kp, &[sc.pages, ps, 1, p]),
        scale,
        true,
        None,
    )
    .unwrap();
    let gather =
        |src: &[f32], w: usize| -> Vec<f32> { (0..s).flat_map(|j| src[sc.row(0, j) * w..][..w].to_vec()).collect() };
    let (lat_c, kp_c) = (f(&gather(&latent, r), &[s, r]), f(&gather(&kp, p), &[s, p]));
    let scores = api::mla_scores(&qt, &qpt, &lat_c, &kp_c, scale).unwrap().to_f32_vec().unwrap();
    let mut probs = vec![0.0f32; h * n * s];
    for hh in 0..h {
        for (t, &(_, pos)) in sc.queries.iter().enumerate() {
            let row = &scores[(hh * n + t) * s..][..s];
            let m = row[..=pos].iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let total: f32 = row[..=pos].iter().map(|v| (v - m).exp()).sum();
            for j in 0..=pos {
                probs[(hh * n + t) * s + j] = (row[j] - m).exp() / total;
            }
        }
    }
    let composed = api::mla_value_product(&f(&probs, &[h, n, s]), &lat_c).unwrap().to_f32_vec().unwrap();
    let composed: Vec<f64> = composed.iter().map(|v| *v as f64).collect();
    assert_close("paged_mla vs composed pieces", &paged.to_f32_vec().unwrap(), &composed, 1e-5, 0.0);
}

#[test]
fn paged_mla_rejects_bad_arguments() {
    let dev = device();
    let mut rng = Rng::new(5);
    let sc = Schedule::new(&mut rng, 4, &[5], 1);
    let [tables, lengths, sequence_ids, positions] = sc.upload(&dev);
    let plan = MlaPlanView {
        tables: &tables,
        lengths: &lengths,
        sequence_ids: &sequence_ids,
        positions: &positions,
        page_size: 4,
        max_length: 5,
    };
    let z = |shape: &[usize]| Tensor::zeros(&dev, DType::F32, shape).unwrap();
    let pages = sc.pages;
    let call = |r: usize, p: usize, scale: f32, split: Option<(&Tensor, usize)>| {
        paged_mla_forward(
            &plan,
            &z(&[1, 2, r]),
            &z(&[1, 2, p]),
            &z(&[pages, 4, 1, r]),
            &z(&[pages, 4, 1, p]),
            scale,
            true,
            split,
        )
        .unwrap_err()
    };
    let err = call(8, 257, 0.1, None);
    assert!(matches!(err, OpError::Shape { op: "paged_mla", .. }) && err.to_string().contains("1..=256"), "{err}");
    let err = call(1025, 8, 0.1, None);
    assert!(err.to_string().contains("1..=1024"), "{err}");
    let err = call(8, 8, 0.0, None);
    assert!(matches!(err, OpError::InvalidArgument { .. }) && err.to_string().contains("positive"), "{err}");
    let ws = z(&[8]);
    let err = call(8, 8, 0.1, Some((&ws, 2)));
    assert!(err.to_string().contains("at least"), "{err}");
    let err = call(8, 8, 0.1, Some((&ws, 33)));
    assert!(err.to_string().contains("2..=32"), "{err}");
    let err = paged_mla_forward(
        &plan,
        &z(&[1, 2, 8]),
        &z(&[1, 2, 4]),
        &z(&[pages, 2, 1, 8]),
        &z(&[pages, 2, 1, 4]),
        0.1,
        true,
        None,
    )
    .unwrap_err();
    assert!(err.to_string().contains("pages of 2 slots"), "{err}");
}

#[test]
fn device_plan_mla_matches_the_reference() {
    use ruda_ops::api::paged_attention::{DevicePlan, HostPlan, PlanCapacity};
    let dev = device();
    let mut rng = Rng::new(99);
    let (h, r, p) = (3, 64, 16);
    let sc = Schedule::new(&mut rng, 4, &[9, 5, 12], 1);
    let n = sc.queries.len();
    let rows = sc.pages * sc.page_size;
    let x = Inputs {
        q: rng.vec(n * h * r, -1.0, 1.0),
        qp: rng.vec(n * h * p, -1.0, 1.0),
        latent: rng.vec(rows * r, -1.0, 1.0),
        kp: rng.vec(rows * p, -1.0, 1.0),
    };
    let lengths: Vec<u32> = sc.lengths.iter().map(|&l| l as u32).collect();
    let ids: Vec<u32> = sc.queries.iter().map(|q| q.0 as u32).collect();
    let positions: Vec<u32> = sc.queries.iter().map(|q| q.1 as u32).collect();
    let host = HostPlan::new(sc.page_size, sc.pages, &sc.tables, &lengths, &ids, &positions).unwrap();
    let f = |v: &[f32], shape: &[usize]| tensor(&dev, DType::F32, v, shape);
    let q = f(&x.q, &[n, h, r]);
    // Capacity past the plan: the per-query buffers are cut to the plan's queries.
    let cap = PlanCapacity { queries: 8, sequences: 4, pages_per_sequence: 6 };
    let plan = DevicePlan::upload_with_capacity(&host, &q, cap).unwrap();
    let (latent, kp) = (f(&x.latent, &[sc.pages, 4, 1, r]), f(&x.kp, &[sc.pages, 4, 1, p]));
    let got = plan.mla(&q, &f(&x.qp, &[n, h, p]), &latent, &kp, 0.1, true).unwrap();
    let want = reference(&sc, &x, h, r, p, 0.1, true);
    assert_close("DevicePlan::mla", &got.to_f32_vec().unwrap(), &want, 2e-5, 0.0);
    let wrong = f(&vec![0.0; (sc.pages + 1) * 4 * r], &[sc.pages + 1, 4, 1, r]);
    let err = plan.mla(&q, &f(&x.qp, &[n, h, p]), &wrong, &kp, 0.1, true).unwrap_err();
    assert!(err.to_string().contains("plan's"), "{err}");
}
