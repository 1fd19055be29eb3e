//! The linear family's one entry point: every strategy and epilogue through
//! `linear_with_into`, against the fixed-argument forms.

use ruda_ops::api::{self, Epilogue, LinearProblem, Strategy};
use ruda_runtime::{DType, Tensor};

use crate::common::*;

#[test]
fn strategies_and_epilogues_match_the_fixed_forms() {
    let dev = device();
    let stream = dev.default_stream();
    let data = |n: usize, s: f32| (0..n).map(|i| ((i % 9) as f32 - 4.0) * s).collect::<Vec<_>>();
    let t =
        |v: Vec<f32>, shape: &[usize]| api::cast(&Tensor::from_slice(&dev, &v, shape).unwrap(), DType::BF16).unwrap();
    let (x, w, bias) = (t(data(2 * 64, 0.1), &[2, 64]), t(data(8 * 64, 0.05), &[8, 64]), t(data(8, 0.5), &[8]));
    let ws = Tensor::zeros(&dev, DType::F32, &[2 * 2 * 8]).unwrap();
    let run = |e: Epilogue<'_>, s: Strategy| {
        let out = Tensor::zeros(&dev, DType::BF16, &[2, 8]).unwrap();
        let p = LinearProblem { x: &x, w: &w, out: &out, workspace: Some(&ws) };
        api::linear_with_into(&stream, p, e, s).map(|()| out.to_bytes().unwrap())
    };
    let fixed = |f: &dyn Fn(&Tensor)| {
        let out = Tensor::zeros(&dev, DType::BF16, &[2, 8]).unwrap();
        f(&out);
        out.to_bytes().unwrap()
    };
    let biased = Epilogue { bias: Some(&bias), residual: None };
    let gemv2 = Strategy::Gemv { splits: Some(2) };
    assert_eq!(
        run(biased, gemv2).unwrap(),
        fixed(&|o| api::gemv_bias_into(&stream, &x, &w, &bias, o, Some(&ws), 2).unwrap())
    );
    assert_eq!(
        run(Epilogue::NONE, gemv2).unwrap(),
        fixed(&|o| api::gemv_split_k_into(&stream, &x, &w, o, &ws, 2).unwrap())
    );
    assert_eq!(
        run(Epilogue::NONE, Strategy::Gemv { splits: None }).unwrap(),
        fixed(&|o| api::gemv_into(&stream, &x, &w, o, Some(&ws)).unwrap())
    );
    assert_eq!(
        run(biased, Strategy::Auto).unwrap(),
        fixed(&|o| api::linear_bias_into(&stream, &x, &w, Some(&bias), None, o).unwrap())
    );
    // What a strategy cannot take is an error naming it.
    let r = Tensor::zeros(&dev, DType::BF16, &[2, 8]).unwrap();
    let e = run(Epilogue { bias: None, residual: Some(&r) }, gemv2).unwrap_err().to_string();
    assert!(e.contains("the GEMV's epilogue is a bias"), "{e}");
    let e = run(Epilogue::NONE, Strategy::Gemv { splits: Some(0) }).unwrap_err().to_string();
    assert!(e.contains("splits must be at least 1"), "{e}");
}
