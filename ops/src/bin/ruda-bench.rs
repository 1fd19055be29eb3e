//! `ruda-bench`: times RUDA's ops on the device `RUDA_DEVICE` names and prints one JSON object
//! per line. The GPU rung (`scripts/gpu/run.sh`) runs it beside `bench/baseline.py`, which times
//! the same problems with PyTorch on the same GPU, and reports the ratios.
//!
//! Usage: `ruda-bench [--iters N] [--quick]` (`--quick`: small shapes, for a smoke run on the
//! interpreter).

use std::process::ExitCode;
use std::time::Instant;

use half::bf16;
use ruda_ops::api;
use ruda_runtime::{DType, Device, Stream, Tensor};

/// One timed launch of an op on its prepared inputs.
type Launch = Box<dyn Fn(&Stream) -> Result<(), api::OpError>>;

struct Problem {
    name: &'static str,
    shape: Vec<usize>,
    run: Launch,
}

fn random_bf16(device: &Device, shape: &[usize], seed: u64) -> Result<Tensor, api::OpError> {
    let n: usize = shape.iter().product();
    let mut state = seed;
    let data: Vec<bf16> = (0..n)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            bf16::from_f32(((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0)
        })
        .collect();
    Ok(Tensor::from_slice(device, &data, shape)?)
}

fn problems(device: &Device, quick: bool) -> Result<Vec<Problem>, Box<dyn std::error::Error>> {
    let (big, hidden) = if quick { (64, 256) } else { (4096, 4096) };
    let mut out = Vec::new();

    for m in [1, big] {
        let (n, k) = (hidden, hidden);
        let x = random_bf16(device, &[m, k], 1)?;
        let w = random_bf16(device, &[n, k], 2)?;
        let y = Tensor::empty(device, DType::BF16, &[m, n])?;
        out.push(Problem {
            name: "linear_bf16",
            shape: vec![m, n, k],
            run: Box::new(move |s| api::linear_into(s, &x, &w, &y)),
        });
    }
    {
        let x = random_bf16(device, &[big, hidden], 3)?;
        let g = Tensor::from_slice(device, &vec![1.0f32; hidden], &[hidden])?;
        let y = Tensor::empty(device, DType::BF16, &[big, hidden])?;
        out.push(Problem {
            name: "rms_norm_bf16",
            shape: vec![big, hidden],
            run: Box::new(move |s| api::rms_norm_into(s, &x, &g, 1e-6, &y)),
        });
    }
    {
        let x = random_bf16(device, &[big, hidden], 4)?;
        let y = Tensor::empty(device, DType::BF16, &[big, hidden])?;
        out.push(Problem {
            name: "softmax_bf16",
            shape: vec![big, hidden],
            run: Box::new(move |s| api::softmax_last_axis_into(s, &x, &y)),
        });
    }
    {
        let a = random_bf16(device, &[big * hidden], 5)?;
        let b = random_bf16(device, &[big * hidden], 6)?;
        let y = Tensor::empty(device, DType::BF16, &[big * hidden])?;
        out.push(Problem {
            name: "add_bf16",
            shape: vec![big * hidden],
            run: Box::new(move |s| api::add_into(s, &a, &b, &y)),
        });
    }
    {
        let x = random_bf16(device, &[big * hidden], 7)?;
        let y = Tensor::empty(device, DType::BF16, &[big * hidden])?;
        out.push(Problem {
            name: "silu_bf16",
            shape: vec![big * hidden],
            run: Box::new(move |s| api::silu_into(s, &x, &y)),
        });
    }
    // Prefill attention, Qwen3-0.6B-like heads (16 query, 8 KV, D = 128), causal, one sequence.
    for t in if quick { vec![64] } else { vec![1024, 4096] } {
        let (hq, hkv, d) = (16, 8, 128);
        let q = random_bf16(device, &[t, hq, d], 8)?;
        let k = random_bf16(device, &[t, hkv, d], 9)?;
        let v = random_bf16(device, &[t, hkv, d], 10)?;
        // Two tensors: the CPU device does not let one buffer be two arguments.
        let cu_q = Tensor::from_slice(device, &[0u32, t as u32], &[2])?;
        let cu_k = Tensor::from_slice(device, &[0u32, t as u32], &[2])?;
        let o = Tensor::empty(device, DType::BF16, &[t, hq, d])?;
        out.push(Problem {
            name: "attention_prefill_bf16",
            shape: vec![t, hq, hkv, d],
            run: Box::new(move |s| api::attention_prefill_varlen_into(s, &q, &k, &v, &cu_q, &cu_k, t, None, true, &o)),
        });
    }
    // Decode attention: 8 sequences of 4096 cached tokens, the same heads.
    {
        let (b, hq, hkv, d, s_len) = (8, 16, 8, 128, if quick { 64 } else { 4096 });
        let q = random_bf16(device, &[b, hq, d], 11)?;
        let kc = random_bf16(device, &[b, hkv, s_len, d], 12)?;
        let vc = random_bf16(device, &[b, hkv, s_len, d], 13)?;
        let lens = Tensor::from_slice(device, &vec![s_len as u32; b], &[b])?;
        let ws = api::DecodeWorkspace::new(&q, api::decode_splits(b, hq, hkv, d, s_len))?;
        let o = Tensor::empty(device, DType::BF16, &[b, hq, d])?;
        out.push(Problem {
            name: "attention_decode_bf16",
            shape: vec![b, hq, hkv, d, s_len],
            run: Box::new(move |s| api::attention_decode_into(s, &q, &kc, &vc, &lens, None, &ws, &o)),
        });
    }
    {
        let x = random_bf16(device, &[big, hidden], 14)?;
        let r = random_bf16(device, &[big, hidden], 15)?;
        let g = Tensor::from_slice(device, &vec![1.0f32; hidden], &[hidden])?;
        let (y, r_out) = (Tensor::empty(device, DType::BF16, &[big, hidden])?, Tensor::empty(device, DType::BF16, &[big, hidden])?);
        out.push(Problem {
            name: "rms_norm_residual_bf16",
            shape: vec![big, hidden],
            run: Box::new(move |s| api::rms_norm_residual_into(s, &x, &r, &g, 1e-6, &y, &r_out)),
        });
    }
    {
        let vocab = if quick { 1000 } else { 151_936 };
        let logits = random_bf16(device, &[1, vocab], 16)?;
        let ids = Tensor::empty(device, DType::U32, &[1])?;
        let ws_len = api::argmax_workspace_len(device, 1, vocab);
        let ws = Tensor::empty(device, DType::U64, &[ws_len.max(1)])?;
        out.push(Problem {
            name: "argmax_bf16",
            shape: vec![1, vocab],
            run: Box::new(move |s| api::argmax_into(s, &logits, &ids, (ws_len > 0).then_some(&ws))),
        });
    }
    Ok(out)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let iters: u32 = match args.iter().position(|a| a == "--iters").map(|i| args.get(i + 1)) {
        None => 20,
        Some(Some(n)) => match n.parse() {
            Ok(n) if n > 0 => n,
            _ => {
                eprintln!("ruda-bench: --iters needs a positive integer, got {n}");
                return ExitCode::from(2);
            }
        },
        Some(None) => {
            eprintln!("ruda-bench: --iters needs a value");
            return ExitCode::from(2);
        }
    };
    match run(quick, iters) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ruda-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(quick: bool, iters: u32) -> Result<(), Box<dyn std::error::Error>> {
    let device = Device::from_env()?;
    let stream = device.default_stream();
    eprintln!("ruda-bench: {} ({} iterations per problem)", device.description(), iters);
    for p in problems(&device, quick)? {
        // Warm-up: compiles and loads the module, and settles clocks.
        for _ in 0..3 {
            (p.run)(&stream)?;
        }
        stream.synchronize()?;
        let started = Instant::now();
        for _ in 0..iters {
            (p.run)(&stream)?;
        }
        stream.synchronize()?;
        let ms = started.elapsed().as_secs_f64() * 1e3 / iters as f64;
        let shape: Vec<String> = p.shape.iter().map(|d| d.to_string()).collect();
        println!("{{\"op\":\"{}\",\"shape\":[{}],\"ruda_ms\":{ms:.6}}}", p.name, shape.join(","));
        eprintln!("  {:<14} {:?}: {ms:.4} ms", p.name, p.shape);
    }
    Ok(())
}
