//! Tensor-core GEMM family (`gemm.{f16,bf16}.tc*`): every registered configuration against an
//! f64 reference on shapes that are not multiples of any tile (epilogues, f32 output, batch),
//! the swizzle's freedom from bank conflicts, the `linear` entry points (dispatch, epilogue,
//! batched, fallbacks, errors), and HMMA in the SASS `ptxas` makes (when `nvdisasm` exists).

use crate::common::*;
use ruda_ir::passes::optimize;
use ruda_ir::{MmaType, ScalarType};
use ruda_ops::api::{self, GemmTile};
use ruda_ops::kernels::gemm_tc::{registered_configs, swizzle_chunk, TcTile, BK};
use ruda_ops::kernels::{gemm_tc, GemmTcConfig};
use ruda_runtime::{Arg, DType, LaunchConfig, Tensor};

fn dtype_of(t: ScalarType) -> DType {
    match t {
        ScalarType::F16 => DType::F16,
        ScalarType::BF16 => DType::BF16,
        _ => DType::F32,
    }
}

/// Random `x[m, k]`, `w[n, k]` rounded to `dtype`.
fn problem(rng: &mut Rng, dtype: DType, m: usize, n: usize, k: usize) -> (Vec<f32>, Vec<f32>) {
    (quantize(dtype, &rng.vec(m * k, -1.0, 1.0)), quantize(dtype, &rng.vec(n * k, -1.0, 1.0)))
}

/// `x · wᵀ + bias + residual` in f64 with the magnitudes for the tolerance (the addends count
/// in the magnitude: each is one more f32 rounding).
fn reference(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    res: Option<&[f32]>,
    m: usize,
    n: usize,
    k: usize,
) -> (Vec<f64>, Vec<f64>) {
    let (mut want, mut mag) = linear_reference(x, w, m, n, k);
    for i in 0..m * n {
        for add in [bias.map(|b| b[i % n]), res.map(|r| r[i])].into_iter().flatten() {
            want[i] += add as f64;
            mag[i] += add.abs() as f64;
        }
    }
    (want, mag)
}

/// Run `cfg` directly on `batch` problems of `m × n × k` (one shared weight unless
/// `w_batched`) and check every output element, poisoned beforehand, against the reference.
fn check_config(rng: &mut Rng, cfg: &GemmTcConfig, m: usize, n: usize, k: usize, batch: usize, w_batched: bool) {
    let dev = device();
    let stream = dev.default_stream();
    let (dt, odt) = (dtype_of(cfg.dtype()), dtype_of(cfg.out));
    let mut kern = gemm_tc(cfg).unwrap();
    optimize(&mut kern).unwrap();
    let wb = if w_batched { batch } else { 1 };
    let x = quantize(dt, &rng.vec(batch * m * k, -1.0, 1.0));
    let w = quantize(dt, &rng.vec(wb * n * k, -1.0, 1.0));
    let bias = quantize(dt, &rng.vec(n, -1.0, 1.0));
    let res = quantize(odt, &rng.vec(batch * m * n, -2.0, 2.0));
    let xt = tensor(&dev, dt, &x, &[batch * m * k]);
    let wt = tensor(&dev, dt, &w, &[wb * n * k]);
    let bt = tensor(&dev, dt, &bias, &[n]);
    let rt = tensor(&dev, odt, &res, &[batch * m * n]);
    let out = tensor(&dev, odt, &vec![f32::NAN; batch * m * n], &[batch * m * n]);
    let (mu, nu, ku) = (m as u32, n as u32, k as u32);
    let mut args = vec![Arg::Tensor(&xt), Arg::Tensor(&wt)];
    if cfg.bias {
        args.push(Arg::Tensor(&bt));
    }
    if cfg.residual {
        args.push(Arg::Tensor(&rt));
    }
    args.extend([Arg::Tensor(&out), Arg::scalar(mu), Arg::scalar(nu), Arg::scalar(ku)]);
    if cfg.batched {
        args.extend([Arg::scalar(mu * ku), Arg::scalar(if w_batched { nu * ku } else { 0 }), Arg::scalar(mu * nu)]);
    }
    let launch =
        LaunchConfig { grid: cfg.grid(mu, nu, batch as u32), block: [cfg.threads(), 1, 1], dynamic_shared_bytes: 0 };
    stream.launch(&kern, launch, &args).unwrap();
    let got = out.to_f32_vec().unwrap();
    for e in 0..batch {
        let we = if w_batched { e } else { 0 };
        let (want, mag) = reference(
            &x[e * m * k..][..m * k],
            &w[we * n * k..][..n * k],
            cfg.bias.then_some(&bias[..]),
            cfg.residual.then_some(&res[e * m * n..][..m * n]),
            m,
            n,
            k,
        );
        let what = format!("{} {m}x{n}x{k} batch entry {e}", cfg.id());
        check_linear(&what, odt, &got[e * m * n..][..m * n], &want, &mag, k);
    }
}

#[test]
fn every_registered_config_matches_the_reference_on_partial_tiles() {
    let mut rng = Rng::new(21);
    let cfgs = registered_configs();
    // Ids are unique and name what they build.
    let ids: std::collections::BTreeSet<String> = cfgs.iter().map(|c| c.id()).collect();
    assert_eq!(ids.len(), cfgs.len());
    assert!(ids.contains("gemm.bf16.tc128x128w4.s3.out_f32"), "{ids:?}");
    for cfg in &cfgs {
        // Partial tiles in m and n; k a multiple of 8 but not of BK (the last k-tile is
        // partial), and more k-tiles than stages so the ring wraps.
        let (bm, bn) = cfg.tile.dims();
        let (bm, bn) = (bm as usize, bn as usize);
        let batch = if cfg.batched { 3 } else { 1 };
        let k = if cfg.batched { 40 } else { 4 * BK as usize + 8 };
        // An odd N (single-column stores), then an even one (paired stores, a second block column).
        check_config(&mut rng, cfg, bm + 5, bn - 7, k, batch, false);
        check_config(&mut rng, cfg, bm - 3, bn + 6, 24, batch, false);
    }
}

#[test]
fn small_and_odd_shapes_and_batched_weights() {
    let mut rng = Rng::new(23);
    for ty in [MmaType::F16, MmaType::BF16] {
        let cfg = GemmTcConfig { bias: true, residual: true, ..GemmTcConfig::new(ty, TcTile::T64x64, 2) };
        // One row and column; a single partial k-tile; k shorter than the prologue.
        for (m, n, k) in [(1, 1, 8), (3, 17, 16), (17, 33, 72)] {
            check_config(&mut rng, &cfg, m, n, k, 1, false);
        }
    }
    let cfg = GemmTcConfig { batched: true, ..GemmTcConfig::new(MmaType::BF16, TcTile::T64x128, 3) };
    check_config(&mut rng, &cfg, 9, 70, 24, 2, true);
}

#[test]
fn invalid_configs_are_errors() {
    let bad = GemmTcConfig { stages: 1, ..GemmTcConfig::new(MmaType::BF16, TcTile::T64x64, 2) };
    assert!(gemm_tc(&bad).unwrap_err().to_string().contains("1 stages"));
    let bad = GemmTcConfig { out: ScalarType::U32, ..GemmTcConfig::new(MmaType::BF16, TcTile::T64x64, 2) };
    assert!(gemm_tc(&bad).is_err());
}

/// The 16-byte bank group (0..8) of shared byte address `a`: 32 banks of 4 bytes.
fn bank_group(a: u32) -> u32 {
    (a / 16) % 8
}

#[test]
fn swizzled_ldmatrix_phases_and_staging_stores_are_free_of_bank_conflicts() {
    let row_bytes = BK * 2;
    let addr = |row: u32, chunk: u32| row * row_bytes + swizzle_chunk(row, chunk) * 16;
    // Swizzling permutes the chunks of a row.
    for row in 0..16 {
        let mut c: Vec<u32> = (0..BK / 8).map(|ch| swizzle_chunk(row, ch)).collect();
        c.sort();
        assert_eq!(c, (0..BK / 8).collect::<Vec<_>>());
    }
    // An ldmatrix phase: 8 rows from a multiple of 8, one logical chunk.
    for r0 in (0..128).step_by(8) {
        for chunk in 0..BK / 8 {
            let mut groups: Vec<u32> = (r0..r0 + 8).map(|r| bank_group(addr(r, chunk))).collect();
            groups.sort();
            groups.dedup();
            assert_eq!(groups.len(), 8, "rows {r0}.. chunk {chunk}");
        }
    }
    // A quarter warp's staging stores: thread e writes row e / 4, chunk e % 4.
    for q in (0..256).step_by(8) {
        let mut groups: Vec<u32> = (q..q + 8).map(|e| bank_group(addr(e / 4, e % 4))).collect();
        groups.sort();
        groups.dedup();
        assert_eq!(groups.len(), 8, "threads {q}..");
    }
    // Unswizzled, the same phase would hit 2 groups: the test can fail.
    let plain: std::collections::BTreeSet<u32> = (0..8).map(|r| bank_group(r * row_bytes)).collect();
    assert_eq!(plain.len(), 2);
}

#[test]
fn linear_uses_tensor_cores_when_aligned_and_falls_back_otherwise() {
    let dev = device();
    let mut rng = Rng::new(22);
    // K % 8 == 0 takes the tensor-core kernel; K = 36 and a misaligned view of x take SIMT.
    for dtype in [DType::F16, DType::BF16] {
        for (m, n, k) in [(17, 33, 40), (130, 70, 16), (20, 9, 36)] {
            let (x, w) = problem(&mut rng, dtype, m, n, k);
            let got = api::linear(&tensor(&dev, dtype, &x, &[m, k]), &tensor(&dev, dtype, &w, &[n, k])).unwrap();
            assert_eq!((got.dtype(), got.shape()), (dtype, &[m, n][..]));
            let (want, mag) = linear_reference(&x, &w, m, n, k);
            check_linear(&format!("linear {dtype} {m}x{n}x{k}"), dtype, &got.to_f32_vec().unwrap(), &want, &mag, k);
        }
        // x's rows start one element into a larger buffer: 2 bytes off 16-byte alignment.
        let (m, n, k) = (18, 12, 16);
        let (x, w) = problem(&mut rng, dtype, m, n, k);
        let mut padded = vec![0f32];
        padded.extend(&x);
        let big = tensor(&dev, dtype, &padded, &[m * k + 1]);
        let xv: Tensor = big.narrow(0, 1, m * k).unwrap().reshape(&[m, k]).unwrap();
        let got = api::linear(&xv, &tensor(&dev, dtype, &w, &[n, k])).unwrap();
        let (want, mag) = linear_reference(&x, &w, m, n, k);
        check_linear(
            &format!("linear {dtype} misaligned {m}x{n}x{k}"),
            dtype,
            &got.to_f32_vec().unwrap(),
            &want,
            &mag,
            k,
        );
    }
}

#[test]
fn linear_bias_fuses_the_epilogue_and_f32_output() {
    let dev = device();
    let stream = dev.default_stream();
    let mut rng = Rng::new(24);
    // M = 3 (GEMV territory) still takes the fused tensor-core path.
    for (dtype, odt, m, n, k) in [
        (DType::BF16, DType::BF16, 20, 24, 32),
        (DType::F16, DType::F32, 3, 10, 16),
        (DType::BF16, DType::F32, 33, 8, 8),
    ] {
        let (x, w) = problem(&mut rng, dtype, m, n, k);
        let bias = quantize(dtype, &rng.vec(n, -1.0, 1.0));
        let res = quantize(odt, &rng.vec(m * n, -1.0, 1.0));
        let (xt, wt) = (tensor(&dev, dtype, &x, &[m, k]), tensor(&dev, dtype, &w, &[n, k]));
        let (bt, rt) = (tensor(&dev, dtype, &bias, &[n]), tensor(&dev, odt, &res, &[m, n]));
        for (b, r) in [(true, false), (false, true), (true, true), (false, false)] {
            let out = Tensor::empty(&dev, odt, &[m, n]).unwrap();
            api::linear_bias_into(&stream, &xt, &wt, b.then_some(&bt), r.then_some(&rt), &out).unwrap();
            let (want, mag) = reference(&x, &w, b.then_some(&bias[..]), r.then_some(&res[..]), m, n, k);
            check_linear(
                &format!("linear_bias {dtype}->{odt} {m}x{n}x{k} bias {b} residual {r}"),
                odt,
                &out.to_f32_vec().unwrap(),
                &want,
                &mag,
                k,
            );
        }
        // An explicit tile gives the same bits as the heuristic's (same k order).
        let a = Tensor::empty(&dev, odt, &[m, n]).unwrap();
        let bb = Tensor::empty(&dev, odt, &[m, n]).unwrap();
        api::linear_bias_into(&stream, &xt, &wt, Some(&bt), Some(&rt), &a).unwrap();
        api::linear_tile_into(
            &stream,
            &xt,
            &wt,
            Some(&bt),
            Some(&rt),
            &bb,
            GemmTile { tile: TcTile::T128x128, stages: 2 },
        )
        .unwrap();
        assert_bits("tile independence", &bb.to_f32_vec().unwrap(), &a.to_f32_vec().unwrap());
    }
}

#[test]
fn linear_bias_allocating_falls_back_to_separate_ops() {
    let dev = device();
    let mut rng = Rng::new(25);
    // f32 (no tensor cores), a decode-sized bf16 product (GEMV then elementwise), a large one.
    for (dtype, m, n, k) in [(DType::F32, 5, 6, 7), (DType::BF16, 2, 16, 64), (DType::BF16, 40, 16, 64)] {
        let (x, w) = problem(&mut rng, dtype, m, n, k);
        let bias = quantize(dtype, &rng.vec(n, -1.0, 1.0));
        let res = quantize(dtype, &rng.vec(m * n, -1.0, 1.0));
        let got = api::linear_bias(
            &tensor(&dev, dtype, &x, &[m, k]),
            &tensor(&dev, dtype, &w, &[n, k]),
            Some(&tensor(&dev, dtype, &bias, &[n])),
            Some(&tensor(&dev, dtype, &res, &[m, n])),
        )
        .unwrap();
        let (want, mag) = reference(&x, &w, Some(&bias), Some(&res), m, n, k);
        // Separate ops round after each step: up to three roundings of the dtype, each within
        // one unit of the magnitude.
        for (i, g) in got.to_f32_vec().unwrap().iter().enumerate() {
            let tol = (k as f64 * f32::EPSILON as f64 + 3.0 * epsilon(dtype)) * mag[i] + 1e-6;
            let err = (*g as f64 - want[i]).abs();
            assert!(
                err <= tol,
                "linear_bias {dtype} {m}x{n}x{k}[{i}]: got {g}, want {} (error {err:.3e} > {tol:.3e})",
                want[i]
            );
        }
    }
}

#[test]
fn linear_batched_shares_or_batches_the_weight() {
    let dev = device();
    let mut rng = Rng::new(26);
    // bf16: one tensor-core launch over the batch; f32: one SIMT product per entry.
    for dtype in [DType::BF16, DType::F32] {
        let (b, m, n, k) = (3, 19, 21, 24);
        for w_batched in [false, true] {
            let wb = if w_batched { b } else { 1 };
            let x = quantize(dtype, &rng.vec(b * m * k, -1.0, 1.0));
            let w = quantize(dtype, &rng.vec(wb * n * k, -1.0, 1.0));
            let wshape: Vec<usize> = if w_batched { vec![b, n, k] } else { vec![n, k] };
            let got =
                api::linear_batched(&tensor(&dev, dtype, &x, &[b, m, k]), &tensor(&dev, dtype, &w, &wshape)).unwrap();
            assert_eq!(got.shape(), &[b, m, n]);
            let got = got.to_f32_vec().unwrap();
            for e in 0..b {
                let we = if w_batched { e } else { 0 };
                let (want, mag) = linear_reference(&x[e * m * k..][..m * k], &w[we * n * k..][..n * k], m, n, k);
                check_linear(
                    &format!("linear_batched {dtype} entry {e}"),
                    dtype,
                    &got[e * m * n..][..m * n],
                    &want,
                    &mag,
                    k,
                );
            }
        }
    }
}

#[test]
fn linear_bias_rejects_bad_shapes_and_dtypes() {
    let dev = device();
    let stream = dev.default_stream();
    let z = |dt, shape: &[usize]| Tensor::zeros(&dev, dt, shape).unwrap();
    let (x, w) = (z(DType::BF16, &[20, 16]), z(DType::BF16, &[8, 16]));
    let out = z(DType::BF16, &[20, 8]);
    let err = |r: ruda_ops::api::Result<()>| r.unwrap_err().to_string();
    let e = err(api::linear_bias_into(&stream, &x, &w, None, None, &z(DType::F16, &[20, 8])));
    assert!(e.contains("`out` is f16; for bf16 inputs it must be bf16 or f32"), "{e}");
    let e = err(api::linear_bias_into(&stream, &x, &w, Some(&z(DType::BF16, &[9])), None, &out));
    assert!(e.contains("`bias` is [9], expected [8]"), "{e}");
    let e = err(api::linear_bias_into(&stream, &x, &w, Some(&z(DType::F32, &[8])), None, &out));
    assert!(e.contains("`bias` is f32, expected bf16"), "{e}");
    let e = err(api::linear_bias_into(&stream, &x, &w, None, Some(&z(DType::F32, &[20, 8])), &out));
    assert!(e.contains("`residual` is f32, expected bf16"), "{e}");
    let e = err(api::linear_bias_into(&stream, &x, &z(DType::BF16, &[8, 24]), None, None, &out));
    assert!(e.contains("x is [20, 16] but w is [8, 24]"), "{e}");
    // f32 takes a bias (the SIMT GEMM's epilogue) but not a residual.
    let e = err(api::linear_bias_into(
        &stream,
        &z(DType::F32, &[20, 16]),
        &z(DType::F32, &[8, 16]),
        Some(&z(DType::F32, &[8])),
        Some(&z(DType::F32, &[20, 8])),
        &z(DType::F32, &[20, 8]),
    ));
    assert!(e.contains("use `linear_bias`"), "{e}");
    let e = err(api::linear_tile_into(
        &stream,
        &z(DType::BF16, &[20, 12]),
        &z(DType::BF16, &[8, 12]),
        None,
        None,
        &out,
        GemmTile { tile: TcTile::T64x64, stages: 2 },
    ));
    assert!(e.contains("K % 8 == 0"), "{e}");
    let e = err(api::linear_batched_into(
        &stream,
        &z(DType::BF16, &[2, 20, 16]),
        &z(DType::BF16, &[3, 8, 16]),
        &z(DType::BF16, &[2, 20, 8]),
    ));
    assert!(e.contains("expected [8, 16] or [2, 8, 16]"), "{e}");
    // An output starting at an odd element: no paired stores, so no tensor cores: a residual is
    // an error, a bias alone the SIMT GEMM's epilogue.
    let big = z(DType::BF16, &[20 * 8 + 1]);
    let odd = big.narrow(0, 1, 160).unwrap().reshape(&[20, 8]).unwrap();
    let e = err(api::linear_bias_into(&stream, &x, &w, None, Some(&z(DType::BF16, &[20, 8])), &odd));
    assert!(e.contains("starting at even elements"), "{e}");
    api::linear_bias_into(&stream, &x, &w, Some(&z(DType::BF16, &[8])), None, &odd).unwrap();
    api::linear_into(&stream, &x, &w, &odd).unwrap();
    let e = err(api::linear_batched_into(&stream, &x, &w, &out));
    assert!(e.contains("expected x [B, M, K]"), "{e}");
    assert!(GemmTile::from_name("tc128x64.s3").is_some() && GemmTile::from_name("tc96x64.s3").is_none());
}

#[test]
fn sass_uses_hmma_and_async_copies() {
    use ruda_codegen_ptx::{emit_ptx, ptxas, sass, Arch, Target};
    let Some(ptxas_bin) = ptxas::ptxas_or_skip("gemm_tc::sass_uses_hmma").unwrap() else { return };
    let Some(nvdisasm) = sass::nvdisasm_or_skip("gemm_tc::sass_uses_hmma").unwrap() else { return };
    let cfgs =
        [GemmTcConfig::new(MmaType::F16, TcTile::T64x64, 2), GemmTcConfig::new(MmaType::BF16, TcTile::T128x128W4, 3)];
    for cfg in cfgs {
        let mut kern = gemm_tc(&cfg).unwrap();
        optimize(&mut kern).unwrap();
        let ptx = emit_ptx(&kern, &Target::new(Arch::Sm80)).unwrap();
        let (_, cubin) = ptxas::assemble_cubin_with(&ptxas_bin, &ptx, Arch::Sm80)
            .unwrap_or_else(|e| panic!("ptxas failed on {}: {e}", cfg.id()));
        let sass = sass::disassemble_with(&nvdisasm, &cubin).unwrap_or_else(|e| panic!("{e}"));
        let (wm, wn) = cfg.tile.warp_tile();
        // Per k-tile: two k steps of (WM / 16) x (WN / 8) mma tiles; ldmatrix as LDSM;
        // cp.async as LDGSTS with its group waits (DEPBAR / LDGDEPBAR).
        let (hmma, ldsm, ldgsts) =
            (sass.matches("HMMA").count(), sass.matches("LDSM").count(), sass.matches("LDGSTS").count());
        let want = 2 * (wm / 16) * (wn / 8);
        assert!(hmma as u32 >= want, "{}: {hmma} HMMA (want {want}) in SASS:\n{sass}", cfg.id());
        assert!(ldsm >= 6, "{}: {ldsm} LDSM in SASS", cfg.id());
        assert!(ldgsts >= 4, "{}: {ldgsts} LDGSTS in SASS", cfg.id());
    }
}
