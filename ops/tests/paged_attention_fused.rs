//! Fused paged attention (`DevicePlan::attention` and its split forms) against a contiguous f64
//! reference computed here: page sizes 1, 4 and 16 over shuffled physical pages, ragged
//! lengths (1, and several pages), GQA ratios 1, 2, 4 and 7, D ≠ Dv and odd dims (1, 40, 72,
//! Dv 1024), packed prefill (several sequences of several queries, more queries of one sequence
//! than a query block holds) and decode, causal and not, unsplit and 2, 3 and 32 splits (empty
//! splits included); the plan's capacity and update; split MLA over a workspace; and every
//! refused argument.

use crate::common::*;
use ruda_ops::api::paged_attention::{DevicePlan, HostPlan, PlanCapacity, SplitWorkspace};
use ruda_ops::api::OpError;
use ruda_runtime::{DType, Device, Tensor};

/// A schedule over a shuffled page pool: per sequence its table and length, per query its
/// sequence and position (`new[s]` queries at the end of sequence `s`).
struct Schedule {
    page_size: usize,
    pages: usize,
    tables: Vec<Vec<u32>>,
    lengths: Vec<usize>,
    queries: Vec<(usize, usize)>,
}

impl Schedule {
    fn new(rng: &mut Rng, page_size: usize, lengths: &[usize], new: &[usize]) -> Schedule {
        let need: usize = lengths.iter().map(|l| l.div_ceil(page_size)).sum();
        let pages = need + 3;
        let mut pool: Vec<u32> = (0..pages as u32).collect();
        for i in (1..pool.len()).rev() {
            pool.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
        }
        let mut tables = Vec::new();
        let mut queries = Vec::new();
        for (s, (&len, &n)) in lengths.iter().zip(new).enumerate() {
            tables.push(pool.drain(..len.div_ceil(page_size)).collect());
            queries.extend((len - n..len).map(|p| (s, p)));
        }
        Schedule { page_size, pages, tables, lengths: lengths.to_vec(), queries }
    }

    fn host(&self) -> HostPlan {
        let lengths: Vec<u32> = self.lengths.iter().map(|&l| l as u32).collect();
        let ids: Vec<u32> = self.queries.iter().map(|q| q.0 as u32).collect();
        let positions: Vec<u32> = self.queries.iter().map(|q| q.1 as u32).collect();
        HostPlan::new(self.page_size, self.pages, &self.tables, &lengths, &ids, &positions).unwrap()
    }

    /// The physical row of key `j` of sequence `s`.
    fn row(&self, s: usize, j: usize) -> usize {
        self.tables[s][j / self.page_size] as usize * self.page_size + j % self.page_size
    }
}

/// Sizes: query heads, kv heads, head dim, value head dim.
#[derive(Clone, Copy)]
struct Heads {
    hq: usize,
    hkv: usize,
    d: usize,
    dv: usize,
}

struct Inputs {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl Inputs {
    fn new(rng: &mut Rng, dt: DType, sc: &Schedule, h: Heads) -> Inputs {
        let rows = sc.pages * sc.page_size;
        Inputs {
            q: quantize(dt, &rng.vec(sc.queries.len() * h.hq * h.d, -1.0, 1.0)),
            k: quantize(dt, &rng.vec(rows * h.hkv * h.d, -1.0, 1.0)),
            v: quantize(dt, &rng.vec(rows * h.hkv * h.dv, -1.0, 1.0)),
        }
    }

    fn tensors(&self, dev: &Device, dt: DType, sc: &Schedule, h: Heads) -> [Tensor; 3] {
        [
            tensor(dev, dt, &self.q, &[sc.queries.len(), h.hq, h.d]),
            tensor(dev, dt, &self.k, &[sc.pages, sc.page_size, h.hkv, h.d]),
            tensor(dev, dt, &self.v, &[sc.pages, sc.page_size, h.hkv, h.dv]),
        ]
    }
}

/// The f64 reference `[queries, Hq, Dv]`, from the pages through the tables.
fn reference(sc: &Schedule, x: &Inputs, h: Heads, scale: f64, causal: bool) -> Vec<f64> {
    let group = h.hq / h.hkv;
    let mut out = vec![0.0; sc.queries.len() * h.hq * h.dv];
    for (qi, &(s, pos)) in sc.queries.iter().enumerate() {
        let end = if causal { (pos + 1).min(sc.lengths[s]) } else { sc.lengths[s] };
        for head in 0..h.hq {
            let kvh = head / group;
            let qv = &x.q[(qi * h.hq + head) * h.d..][..h.d];
            let scores: Vec<f64> = (0..end)
                .map(|j| {
                    let kr = &x.k[(sc.row(s, j) * h.hkv + kvh) * h.d..][..h.d];
                    scale * qv.iter().zip(kr).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>()
                })
                .collect();
            let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|v| (v - m).exp()).collect();
            let total: f64 = w.iter().sum();
            let o = &mut out[(qi * h.hq + head) * h.dv..][..h.dv];
            for (j, wj) in w.iter().enumerate() {
                let vr = &x.v[(sc.row(s, j) * h.hkv + kvh) * h.dv..][..h.dv];
                for (oc, vc) in o.iter_mut().zip(vr) {
                    *oc += wj / total * *vc as f64;
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
    new: &'static [usize],
    heads: Heads,
    causal: bool,
    splits: Option<usize>,
}

fn run(dev: &Device, rng: &mut Rng, c: &Case) {
    let (dt, h) = (c.dtype, c.heads);
    let sc = Schedule::new(rng, c.page_size, c.lengths, c.new);
    let x = Inputs::new(rng, dt, &sc, h);
    let [q, k, v] = x.tensors(dev, dt, &sc, h);
    let scale = 0.7 / (h.d as f32).sqrt();
    let plan = DevicePlan::upload(&sc.host(), &q).unwrap();
    let got = match c.splits {
        None => plan.attention(&q, &k, &v, scale, c.causal).unwrap(),
        Some(s) => {
            let ws = SplitWorkspace::new(&q, sc.queries.len(), h.hq, h.dv, s).unwrap();
            plan.attention_with_workspace(&q, &k, &v, scale, c.causal, &ws).unwrap()
        }
    };
    assert_eq!(got.shape(), &[sc.queries.len(), h.hq, h.dv]);
    let want = reference(&sc, &x, h, scale as f64, c.causal);
    let what = format!(
        "paged attention {dt} page_size={} lengths={:?} new={:?} Hq={} Hkv={} D={} Dv={} causal={} splits={:?}",
        c.page_size, c.lengths, c.new, h.hq, h.hkv, h.d, h.dv, c.causal, c.splits
    );
    let tol = if dt == DType::F32 { 1e-5 } else { 2e-5 + epsilon(dt) };
    assert_close(&what, &got.to_f32_vec().unwrap(), &want, tol, 1e-5);
}

const fn heads(hq: usize, hkv: usize, d: usize, dv: usize) -> Heads {
    Heads { hq, hkv, d, dv }
}

#[test]
fn paged_attention_decode_matches_the_contiguous_reference() {
    let dev = device();
    let mut rng = Rng::new(2024);
    let f32 = DType::F32;
    let cases = [
        // Hq = Hkv, page size 1, a length-1 sequence.
        (f32, 1, &[5, 1, 9][..], heads(2, 2, 8, 8), true, None),
        // Qwen2.5-0.5B's GQA 14 / 2, D ≠ Dv, lengths over several pages, split in 2.
        (f32, 4, &[13, 1, 7], heads(14, 2, 40, 24), true, Some(2)),
        (f32, 16, &[20, 3], heads(4, 2, 72, 72), false, Some(3)),
        // D = Dv = 1 and 32 splits of one key: most splits are empty.
        (f32, 4, &[6, 3, 2], heads(2, 1, 1, 1), true, Some(32)),
        // Dv = 1024: a block holds 6 rows, so the group of 7 takes two row chunks.
        (f32, 4, &[3, 5], heads(7, 1, 8, 1024), true, None),
        (DType::F16, 4, &[11, 6], heads(4, 1, 40, 24), true, Some(3)),
        (DType::BF16, 16, &[18, 5], heads(2, 2, 72, 40), false, None),
    ];
    for (dtype, page_size, lengths, heads, causal, splits) in cases {
        let new: &'static [usize] = &[1, 1, 1][..lengths.len()];
        let c = Case { dtype, page_size, lengths, new, heads, causal, splits };
        run(&dev, &mut rng, &c);
    }
}

#[test]
fn paged_attention_packed_prefill_matches_the_contiguous_reference() {
    let dev = device();
    let mut rng = Rng::new(4048);
    let f32 = DType::F32;
    let cases = [
        // Several sequences of several queries each (a whole sequence, a length-1 one).
        (f32, 4, &[10, 6, 1][..], &[4, 6, 1][..], heads(14, 2, 40, 24), true, None),
        (f32, 1, &[7, 3], &[3, 2], heads(4, 2, 16, 8), false, Some(2)),
        // 20 queries of one sequence: two query blocks; 16 × 7 rows: row chunks.
        (f32, 16, &[23, 5], &[20, 3], heads(14, 2, 16, 16), true, None),
        // Causal and split: rows of one block with no live key in a split.
        (f32, 4, &[23, 5], &[20, 3], heads(4, 2, 8, 8), true, Some(3)),
        (f32, 4, &[9, 4], &[9, 4], heads(2, 2, 72, 1), false, Some(32)),
        (DType::F16, 4, &[11, 6], &[3, 2], heads(4, 1, 40, 24), true, None),
        (DType::BF16, 16, &[19, 4], &[3, 4], heads(14, 2, 16, 24), true, Some(2)),
    ];
    for (dtype, page_size, lengths, new, heads, causal, splits) in cases {
        let c = Case { dtype, page_size, lengths, new, heads, causal, splits };
        run(&dev, &mut rng, &c);
    }
}

#[test]
fn paged_attention_over_a_plan_with_capacity_and_update() {
    // A prefill plan in buffers sized past it, then a decode plan updated into them; the raw
    // split form over a workspace larger than needed.
    let dev = device();
    let mut rng = Rng::new(31);
    let h = heads(4, 2, 24, 16);
    let cap = PlanCapacity { queries: 12, sequences: 4, pages_per_sequence: 8 };
    let prefill = Schedule::new(&mut rng, 4, &[9, 5], &[4, 5]);
    let x = Inputs::new(&mut rng, DType::F32, &prefill, h);
    let [q, k, v] = x.tensors(&dev, DType::F32, &prefill, h);
    let mut plan = DevicePlan::upload_with_capacity(&prefill.host(), &q, cap).unwrap();
    let got = plan.attention(&q, &k, &v, 0.3, true).unwrap();
    assert_close(
        "prefill over capacity",
        &got.to_f32_vec().unwrap(),
        &reference(&prefill, &x, h, 0.3, true),
        1e-5,
        1e-5,
    );

    // Decode over the same pages: the sequences one longer.
    let decode = Schedule { lengths: vec![10, 6], queries: vec![(0, 9), (1, 5)], ..prefill };
    plan.update(&decode.host()).unwrap();
    let x = Inputs { q: rng.vec(2 * h.hq * h.d, -1.0, 1.0), ..x };
    let q = tensor(&dev, DType::F32, &x.q, &[2, h.hq, h.d]);
    let want = reference(&decode, &x, h, 0.3, true);
    let got = plan.attention(&q, &k, &v, 0.3, true).unwrap();
    assert_close("decode after update", &got.to_f32_vec().unwrap(), &want, 1e-5, 1e-5);
    let ws = Tensor::zeros(&dev, DType::F32, &[10_000]).unwrap();
    let out = Tensor::zeros(&dev, DType::F32, &[2, h.hq, h.dv]).unwrap();
    plan.attention_into(&dev.default_stream(), &q, &k, &v, 0.3, true, Some((&ws, 3)), &out).unwrap();
    assert_close("decode, attention_into split", &out.to_f32_vec().unwrap(), &want, 1e-5, 1e-5);
    // One workspace serves repeated calls of its shape.
    let sw = SplitWorkspace::new(&q, 2, h.hq, h.dv, 2).unwrap();
    assert_eq!((sw.queries(), sw.heads(), sw.value_dim(), sw.splits()), (2, 4, 16, 2));
    assert_eq!(sw.tensor().numel(), 2 * 4 * 2 * (16 + 2));
    for _ in 0..2 {
        plan.attention_with_workspace_into(&dev.default_stream(), &q, &k, &v, 0.3, true, &sw, &out).unwrap();
        assert_close("decode over a SplitWorkspace", &out.to_f32_vec().unwrap(), &want, 1e-5, 1e-5);
    }
}

#[test]
fn paged_mla_with_workspace_matches_the_unsplit_form() {
    let dev = device();
    let mut rng = Rng::new(8);
    let (hh, r, p) = (3, 40, 8);
    let sc = Schedule::new(&mut rng, 4, &[9, 5], &[2, 1]);
    let n = sc.queries.len();
    let rows = sc.pages * sc.page_size;
    let f = |v: Vec<f32>, shape: &[usize]| tensor(&dev, DType::F32, &v, shape);
    let q = f(rng.vec(n * hh * r, -1.0, 1.0), &[n, hh, r]);
    let qp = f(rng.vec(n * hh * p, -1.0, 1.0), &[n, hh, p]);
    let latent = f(rng.vec(rows * r, -1.0, 1.0), &[sc.pages, 4, 1, r]);
    let kp = f(rng.vec(rows * p, -1.0, 1.0), &[sc.pages, 4, 1, p]);
    let plan = DevicePlan::upload(&sc.host(), &q).unwrap();
    let want = plan.mla(&q, &qp, &latent, &kp, 0.2, true).unwrap().to_f32_vec().unwrap();
    let want: Vec<f64> = want.iter().map(|&x| x as f64).collect();
    let ws = SplitWorkspace::new(&q, n, hh, r, 3).unwrap();
    let got = plan.mla_with_workspace(&q, &qp, &latent, &kp, 0.2, true, &ws).unwrap();
    assert_close("mla_with_workspace", &got.to_f32_vec().unwrap(), &want, 1e-5, 1e-5);
    let wrong = SplitWorkspace::new(&q, n, hh, r + 1, 3).unwrap();
    let err = plan.mla_with_workspace(&q, &qp, &latent, &kp, 0.2, true, &wrong).unwrap_err();
    assert!(err.to_string().contains("made for"), "{err}");
}

#[test]
fn paged_attention_rejects_bad_arguments() {
    let dev = device();
    let mut rng = Rng::new(5);
    let sc = Schedule::new(&mut rng, 4, &[5, 3], &[1, 1]);
    let plan = DevicePlan::upload(&sc.host(), &Tensor::zeros(&dev, DType::F32, &[1]).unwrap()).unwrap();
    let pages = sc.pages;
    let z = |dt: DType, shape: &[usize]| Tensor::zeros(&dev, dt, shape).unwrap();
    let f = DType::F32;
    let (q, k, v) = (z(f, &[2, 4, 8]), z(f, &[pages, 4, 2, 8]), z(f, &[pages, 4, 2, 6]));
    let expect = |e: OpError, part: &str| {
        assert!(e.to_string().contains("paged_attention") && e.to_string().contains(part), "{e} (wanted `{part}`)")
    };
    plan.attention(&q, &k, &v, 0.5, true).unwrap();

    for scale in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        let e = plan.attention(&q, &k, &v, scale, true).unwrap_err();
        assert!(matches!(e, OpError::InvalidArgument { .. }) && e.to_string().contains("positive"), "{e}");
    }
    expect(plan.attention(&z(f, &[2, 3, 8]), &k, &v, 0.5, true).unwrap_err(), "multiple of the kv heads");
    let big = plan.attention(&z(f, &[2, 2, 1025]), &z(f, &[pages, 4, 2, 1025]), &v, 0.5, true).unwrap_err();
    expect(big, "1..=1024");
    expect(plan.attention(&q, &k, &z(f, &[pages, 4, 2, 1025]), 0.5, true).unwrap_err(), "value head dim Dv (1025)");
    let mixed = plan.attention(&q, &z(DType::F16, &[pages, 4, 2, 8]), &v, 0.5, true).unwrap_err();
    assert!(matches!(mixed, OpError::DType { .. }) && mixed.to_string().contains("`k_cache`"), "{mixed}");
    expect(plan.attention(&q, &z(f, &[pages, 2, 2, 8]), &v, 0.5, true).unwrap_err(), "`k_cache` must be [pages");
    expect(plan.attention(&q, &z(f, &[pages + 1, 4, 2, 8]), &v, 0.5, true).unwrap_err(), "`k_cache` must be [pages");
    expect(plan.attention(&q, &z(f, &[pages, 4, 16]), &v, 0.5, true).unwrap_err(), "`k_cache`");
    expect(plan.attention(&q, &k, &z(f, &[pages, 4, 1, 6]), 0.5, true).unwrap_err(), "`v_cache` 1");
    expect(plan.attention(&q, &z(f, &[pages, 4, 2, 7]), &v, 0.5, true).unwrap_err(), "head dim 8, `k_cache` 7");
    expect(plan.attention(&z(f, &[3, 4, 8]), &k, &v, 0.5, true).unwrap_err(), "3 queries, the plan 2");
    expect(plan.attention(&z(f, &[8, 8]), &k, &v, 0.5, true).unwrap_err(), "`q` must be");
    expect(plan.attention(&q, &k, &k, 0.5, true).unwrap_err(), "share one allocation");
    let u32q = plan.attention(&z(DType::U32, &[2, 4, 8]), &k, &v, 0.5, true).unwrap_err();
    assert!(matches!(u32q, OpError::DType { .. }), "{u32q}");

    // The split forms.
    let stream = dev.default_stream();
    let out = z(f, &[2, 4, 6]);
    let ws = z(f, &[4096]);
    for s in [1, 33] {
        expect(plan.attention_into(&stream, &q, &k, &v, 0.5, true, Some((&ws, s)), &out).unwrap_err(), "2..=32");
        expect(SplitWorkspace::new(&q, 2, 4, 6, s).err().unwrap(), "2..=32");
    }
    let small = z(f, &[10]);
    expect(plan.attention_into(&stream, &q, &k, &v, 0.5, true, Some((&small, 2)), &out).unwrap_err(), "at least");
    let half = z(DType::F16, &[4096]);
    let e = plan.attention_into(&stream, &q, &k, &v, 0.5, true, Some((&half, 2)), &out).unwrap_err();
    assert!(matches!(e, OpError::DType { .. }) && e.to_string().contains("workspace"), "{e}");
    expect(plan.attention_into(&stream, &q, &k, &v, 0.5, true, None, &z(f, &[2, 4, 8])).unwrap_err(), "`out`");
    for (queries, heads, dv) in [(3, 4, 6), (2, 2, 6), (2, 4, 8)] {
        let other = SplitWorkspace::new(&q, queries, heads, dv, 2).unwrap();
        expect(plan.attention_with_workspace(&q, &k, &v, 0.5, true, &other).unwrap_err(), "made for");
    }
    let side = dev.create_stream().unwrap();
    let q_side = Tensor::zeros_on(&side, f, &[2, 4, 8]).unwrap();
    let other_stream = SplitWorkspace::new(&q_side, 2, 4, 6, 2).unwrap();
    expect(plan.attention_with_workspace(&q, &k, &v, 0.5, true, &other_stream).unwrap_err(), "one stream");
    expect(SplitWorkspace::new(&q, 1024, 64, 128, 32).err().unwrap(), "64 MiB");
    expect(SplitWorkspace::new(&q, 0, 4, 6, 2).err().unwrap(), "positive sizes");
    let ok = SplitWorkspace::new(&q, 2, 4, 6, 2).unwrap();
    plan.attention_with_workspace(&q, &k, &v, 0.5, true, &ok).unwrap();

    // A query without keys cannot be planned: its position must be below its length.
    let e = HostPlan::new(4, 4, &[vec![0], vec![1]], &[3, 0], &[0, 1], &[2, 0]).unwrap_err();
    assert!(e.to_string().contains("not below the length 0"), "{e}");
}
