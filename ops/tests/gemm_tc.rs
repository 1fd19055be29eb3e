//! Tensor-core GEMM (`gemm.{f16,bf16}.tc64x64`): the kernel against an f64 reference on shapes
//! that are not multiples of the tile, the `linear` dispatch (tensor cores when aligned, the
//! SIMT fallback otherwise), and HMMA in the SASS `ptxas` makes of it (when `nvdisasm` exists).

mod common;

use common::*;
use ruda_ir::passes::optimize;
use ruda_ir::MmaType;
use ruda_ops::api;
use ruda_ops::kernels::{gemm_tc, GemmTcConfig};
use ruda_runtime::{Arg, DType, LaunchConfig, Tensor};

const DTYPES: [(DType, MmaType); 2] = [(DType::F16, MmaType::F16), (DType::BF16, MmaType::BF16)];

/// Random `x[m, k]`, `w[n, k]` rounded to `dtype`, with their reference.
fn problem(rng: &mut Rng, dtype: DType, m: usize, n: usize, k: usize) -> (Vec<f32>, Vec<f32>) {
    (quantize(dtype, &rng.vec(m * k, -1.0, 1.0)), quantize(dtype, &rng.vec(n * k, -1.0, 1.0)))
}

#[test]
fn tensor_core_kernel_matches_reference_on_partial_tiles() {
    let dev = device();
    let stream = dev.default_stream();
    let mut rng = Rng::new(21);
    for (dtype, ty) in DTYPES {
        let cfg = GemmTcConfig { ty };
        let mut kern = gemm_tc(&cfg).unwrap();
        optimize(&mut kern).unwrap();
        for (m, n, k) in [(1, 1, 8), (17, 33, 40), (64, 64, 64), (100, 70, 136)] {
            let (x, w) = problem(&mut rng, dtype, m, n, k);
            let (xt, wt) = (tensor(&dev, dtype, &x, &[m, k]), tensor(&dev, dtype, &w, &[n, k]));
            // Poisoned output: every element must be written.
            let out = tensor(&dev, dtype, &vec![f32::NAN; m * n], &[m, n]);
            let (mu, nu, ku) = (m as u32, n as u32, k as u32);
            let launch =
                LaunchConfig { grid: GemmTcConfig::grid(mu, nu), block: [GemmTcConfig::THREADS, 1, 1], dynamic_shared_bytes: 0 };
            let args = [Arg::Tensor(&xt), Arg::Tensor(&wt), Arg::Tensor(&out), Arg::scalar(mu), Arg::scalar(nu), Arg::scalar(ku)];
            stream.launch(&kern, launch, &args).unwrap();
            let (want, mag) = linear_reference(&x, &w, m, n, k);
            check_linear(&format!("{} {m}x{n}x{k}", cfg.id()), dtype, &out.to_f32_vec().unwrap(), &want, &mag, k);
        }
    }
}

#[test]
fn linear_uses_tensor_cores_when_aligned_and_falls_back_otherwise() {
    let dev = device();
    let mut rng = Rng::new(22);
    // K % 8 == 0 takes the tensor-core kernel; K = 36 and a misaligned view of x take SIMT.
    for (dtype, _) in DTYPES {
        for (m, n, k) in [(17, 33, 40), (100, 70, 136), (20, 9, 36)] {
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
        check_linear(&format!("linear {dtype} misaligned {m}x{n}x{k}"), dtype, &got.to_f32_vec().unwrap(), &want, &mag, k);
    }
}

/// `nvdisasm`: `$RUDA_NVDISASM`, else the PyPI wheel's (`nvidia-cuda-nvdisasm` 13.x, which
/// reads 12.9 cubins) in the pinned tools folder, else on `PATH`.
fn find_nvdisasm() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("RUDA_NVDISASM").filter(|v| !v.is_empty()) {
        return Some(p.into());
    }
    let pinned = ruda_codegen_ptx::ptxas::pinned_tools_dir().map(|d| d.join("nvidia/cu13/bin/nvdisasm"));
    if let Some(p) = pinned.filter(|p| p.is_file()) {
        return Some(p);
    }
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join("nvdisasm")).find(|p| p.is_file())
}

#[test]
fn sass_uses_hmma() {
    use ruda_codegen_ptx::{emit_ptx, ptxas, Arch, Target};
    let Some(ptxas_bin) = ptxas::ptxas_or_skip("gemm_tc::sass_uses_hmma").unwrap() else { return };
    let Some(nvdisasm) = find_nvdisasm() else {
        // scripts/install-cuda-tools.sh installs nvdisasm beside ptxas: where ptxas is required
        // (CI), so is this check.
        assert!(
            std::env::var("RUDA_REQUIRE_PTXAS").map_or(true, |v| v != "1"),
            "nvdisasm not found and RUDA_REQUIRE_PTXAS=1: run scripts/install-cuda-tools.sh or set RUDA_NVDISASM"
        );
        eprintln!("SKIPPED: nvdisasm not found (set RUDA_NVDISASM or run scripts/install-cuda-tools.sh): gemm_tc::sass_uses_hmma");
        return;
    };
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gemm_tc_sass");
    std::fs::create_dir_all(&dir).unwrap();
    for ty in [MmaType::F16, MmaType::BF16] {
        let cfg = GemmTcConfig { ty };
        let mut kern = gemm_tc(&cfg).unwrap();
        optimize(&mut kern).unwrap();
        let ptx = emit_ptx(&kern, &Target::new(Arch::Sm80)).unwrap();
        let (ptx_path, cubin) = (dir.join(format!("{}.ptx", cfg.id())), dir.join(format!("{}.cubin", cfg.id())));
        std::fs::write(&ptx_path, ptx).unwrap();
        let st = std::process::Command::new(&ptxas_bin)
            .args(["-arch=sm_80", "-o"])
            .arg(&cubin)
            .arg(&ptx_path)
            .status()
            .unwrap();
        assert!(st.success(), "ptxas failed on {}", cfg.id());
        let out = std::process::Command::new(&nvdisasm).arg(&cubin).output().unwrap();
        assert!(out.status.success(), "nvdisasm failed: {}", String::from_utf8_lossy(&out.stderr));
        let sass = String::from_utf8_lossy(&out.stdout);
        let hmma = sass.matches("HMMA").count();
        let ldsm = sass.matches("LDSM").count();
        // Two k steps of 2 x 4 mma tiles per loop iteration; ldmatrix as LDSM.
        assert!(hmma >= 16, "{}: {hmma} HMMA in SASS:\n{sass}", cfg.id());
        assert!(ldsm >= 12, "{}: {ldsm} LDSM in SASS", cfg.id());
    }
}
