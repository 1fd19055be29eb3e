//! Runs every `.rir` file test under `ir/filetests/` (format: `ir/filetests/README.md`):
//! `verify`, `interpret`, `optimize` and `profile` here; `compile` files live in `ir/filetests/compile/`
//! and run in `codegen-ptx/tests/filetests.rs`. `RUDA_BLESS=1` rewrites the expected output
//! of `optimize` tests.

#[path = "../filetests/harness.rs"]
mod harness;

use harness::{blessing, FileTest};
use ruda_ir::interp::{run, run_profiled, KernelArg, LaunchConfig, Profile};
use ruda_ir::passes::{parse_pipeline, run_pipeline};
use ruda_ir::{parse_kernel, print_kernel, verify, Constant, Kernel, ScalarType, Value};

#[test]
fn filetests() {
    let dir = harness::filetests_dir();
    let compile_dir = dir.join("compile");
    let files: Vec<_> = harness::files_under(&dir).into_iter().filter(|p| !p.starts_with(&compile_dir)).collect();
    harness::run_all(&files, |ft| match ft.kind.as_str() {
        "verify" => verify_test(ft),
        "interpret" => interpret_test(ft),
        "optimize" => optimize_test(ft),
        "profile" => profile_test(ft),
        _ => Err(format!(
            "`test {}` files belong in {} (run by codegen-ptx/tests/filetests.rs)",
            ft.kind,
            compile_dir.display()
        )),
    });
}

fn parse(ft: &FileTest) -> Result<Kernel, String> {
    parse_kernel(&ft.text).map_err(|e| format!("the kernel does not parse:\n{e}"))
}

/// The error must contain every `; error:` substring.
fn check_error(ft: &FileTest, error: &str) -> Result<(), String> {
    for d in ft.all("error") {
        if !error.contains(&d.value) {
            return Err(format!("line {}: the error does not contain {:?}; it is:\n{error}", d.line, d.value));
        }
    }
    Ok(())
}

/// `test verify`: with `; error:` lines the kernel must fail verification with a message
/// containing each; without, it must verify.
fn verify_test(ft: &FileTest) -> Result<(), String> {
    ft.allow_only(&["error"])?;
    let k = parse(ft)?;
    match (verify(&k), ft.all("error").next().is_some()) {
        (Ok(()), false) => Ok(()),
        (Ok(()), true) => Err("the kernel verifies, but `; error:` expects it not to".into()),
        (Err(e), false) => Err(format!("the kernel does not verify:\n{e}")),
        (Err(e), true) => check_error(ft, &e.to_string()),
    }
}

/// `test interpret`: run the launch; with `; error:` lines it must fail with each in its
/// message, else every `; expect` buffer must match bit for bit.
fn interpret_test(ft: &FileTest) -> Result<(), String> {
    ft.allow_only(&["launch", "arg", "expect", "error"])?;
    let k = parse(ft)?;
    verify(&k).map_err(|e| format!("the kernel does not verify:\n{e}"))?;
    let launch = launch_config(ft)?;
    let expectations = expectations(ft, &k)?;
    let mut args = Args::from_header(ft, &k)?;
    let has_error = ft.all("error").next().is_some();
    match (args.run(&k, &launch), has_error) {
        (Ok(()), false) => args.check(&expectations),
        (Ok(()), true) => Err("the launch succeeded, but `; error:` expects it to fail".into()),
        (Err(e), false) => Err(format!("the launch failed: {e}")),
        (Err(e), true) => check_error(ft, &e),
    }
}

/// `test optimize`: run `; passes:` and compare the printed result with the file's
/// `; expected:` section (rewritten under `RUDA_BLESS=1`). With a `; launch`, the input and
/// the output must also compute the same buffers, and any `; expect` must hold for both.
fn optimize_test(ft: &FileTest) -> Result<(), String> {
    ft.allow_only(&["passes", "launch", "arg", "expect"])?;
    let spec = ft.one("passes")?.ok_or("no `; passes:` line")?;
    let passes = parse_pipeline(&spec.value).map_err(|e| format!("line {}: {e}", spec.line))?;
    let input = parse(ft)?;
    verify(&input).map_err(|e| format!("the input kernel does not verify:\n{e}"))?;
    let mut output = input.clone();
    run_pipeline(&mut output, &passes, None).map_err(|e| format!("the pipeline failed: {e}"))?;
    let got = print_kernel(&output);

    // What the kernels compute comes first, so that a miscompile is reported (and never
    // blessed) as one.
    if ft.one("launch")?.is_some() {
        let launch = launch_config(ft)?;
        let expectations = expectations(ft, &input)?;
        let mut before = Args::from_header(ft, &input)?;
        let mut after = Args::from_header(ft, &output)?;
        before.run(&input, &launch).map_err(|e| format!("the input kernel's launch failed: {e}"))?;
        after.run(&output, &launch).map_err(|e| format!("the optimized kernel's launch failed: {e}"))?;
        before.check(&expectations).map_err(|e| format!("the input kernel: {e}"))?;
        after.check(&expectations).map_err(|e| format!("the optimized kernel: {e}"))?;
        for (i, (b, a)) in before.buffers.iter().zip(&after.buffers).enumerate() {
            if b != a {
                return Err(format!("buffer #{i} differs between the input and the optimized kernel"));
            }
        }
    }

    let lines: Vec<&str> = ft.text.lines().collect();
    let marker = lines.iter().rposition(|l| l.trim() == "; expected:");
    if blessing() {
        let keep = marker.map_or(&lines[..], |m| &lines[..m]);
        let mut text = keep.join("\n").trim_end().to_string();
        text.push_str("\n\n; expected:\n");
        for line in got.lines() {
            text.push_str(if line.is_empty() { ";" } else { "; " });
            text.push_str(line);
            text.push('\n');
        }
        std::fs::write(&ft.path, text).map_err(|e| format!("RUDA_BLESS: cannot write: {e}"))?;
    } else {
        let m = marker.ok_or("no `; expected:` section (RUDA_BLESS=1 writes it)")?;
        let mut expected = String::new();
        for (i, line) in lines[m + 1..].iter().enumerate() {
            let body = line
                .trim_start()
                .strip_prefix(';')
                .ok_or_else(|| format!("line {}: every line after `; expected:` starts with `;`", m + i + 2))?;
            expected.push_str(body.strip_prefix(' ').unwrap_or(body));
            expected.push('\n');
        }
        if expected.trim_end() != got.trim_end() {
            return Err(format!(
                "the optimized kernel differs from `; expected:` (RUDA_BLESS=1 rewrites it)\n{}",
                line_diff(&expected, &got)
            ));
        }
    }
    Ok(())
}

/// `test profile`: run the launch profiled on 1 and on 4 CPU threads (the profiles must be
/// equal), check every `; expect` buffer, and every `; count [OP] NAME = N`: the launch's total
/// of counter `NAME` (`instructions.CLASS` for the mix, `dram_bytes_min`), or with `OP` its sum
/// over the sites of that mnemonic.
fn profile_test(ft: &FileTest) -> Result<(), String> {
    ft.allow_only(&["launch", "arg", "expect", "count"])?;
    let k = parse(ft)?;
    verify(&k).map_err(|e| format!("the kernel does not verify:\n{e}"))?;
    let launch = launch_config(ft)?;
    let expectations = expectations(ft, &k)?;
    let mut profiles = vec![];
    for threads in [1, 4] {
        let mut args = Args::from_header(ft, &k)?;
        let profile = args.run_profiled(&k, &launch, threads).map_err(|e| format!("the launch failed: {e}"))?;
        args.check(&expectations)?;
        profiles.push(profile);
    }
    if profiles[0] != profiles[1] {
        return Err(format!(
            "the profile depends on the thread count:\n1 thread: {:?}\n4 threads: {:?}",
            profiles[0], profiles[1]
        ));
    }
    let profile = &profiles[0];
    if ft.all("count").next().is_none() {
        return Err("no `; count NAME = N` line".into());
    }
    for d in ft.all("count") {
        let bad = |why: String| format!("line {}: {why}", d.line);
        let (lhs, rhs) = d.value.split_once('=').ok_or_else(|| bad("expected `; count [OP] NAME = N`".into()))?;
        let want: u64 = rhs.trim().parse().map_err(|_| bad(format!("`{}` is not a count", rhs.trim())))?;
        let words: Vec<&str> = lhs.split_whitespace().collect();
        let (op, name) = match words[..] {
            [name] => (None, name),
            [op, name] => (Some(op), name),
            _ => return Err(bad("expected `; count [OP] NAME = N`".into())),
        };
        let got = count_of(profile, op, name).map_err(bad)?;
        if got != want {
            let sites: Vec<String> = profile
                .sites
                .iter()
                .filter(|s| op.is_none_or(|o| s.op == o))
                .filter_map(|s| {
                    let n = counter(&s.counters, name).ok()?;
                    (n != 0).then(|| format!("  {} {}: {n}", s.inst, s.op))
                })
                .collect();
            return Err(bad(format!("{lhs}= {got}, expected {want}; by site:\n{}", sites.join("\n"))));
        }
    }
    Ok(())
}

/// Counter `name` of the launch, or summed over the sites of mnemonic `op`.
fn count_of(p: &Profile, op: Option<&str>, name: &str) -> Result<u64, String> {
    match op {
        None if name == "dram_bytes_min" => Ok(p.dram_bytes_min),
        None => counter(&p.totals, name),
        Some(op) => {
            let mut sites = p.sites.iter().filter(|s| s.op == op).peekable();
            if sites.peek().is_none() {
                let ops: Vec<&str> = p.sites.iter().map(|s| s.op.as_str()).collect();
                return Err(format!("no site of `{op}` ran; the sites are {ops:?}"));
            }
            sites.map(|s| counter(&s.counters, name)).sum()
        }
    }
}

/// One counter by its JSON name.
fn counter(c: &ruda_ir::interp::Counters, name: &str) -> Result<u64, String> {
    if let Some(class) = name.strip_prefix("instructions.") {
        if class == "total" {
            return Ok(c.instructions.total());
        }
        return c.instructions.fields().into_iter().find(|(n, _)| *n == class).map(|(_, v)| v).ok_or_else(|| {
            let names: Vec<_> = c.instructions.fields().iter().map(|(n, _)| *n).collect();
            format!("`{class}` is no instruction class; they are {names:?} and `total`")
        });
    }
    c.fields().into_iter().find(|(n, _)| *n == name).map(|(_, v)| v).ok_or_else(|| {
        let names: Vec<_> = c.fields().iter().map(|(n, _)| *n).collect();
        format!("`{name}` is no counter; they are {names:?}, `instructions.CLASS` and `dram_bytes_min`")
    })
}

/// Lines of `expected` missing from `got` (`-`) and the reverse (`+`), in order, after the
/// first difference: enough to see what changed in a small kernel.
fn line_diff(expected: &str, got: &str) -> String {
    let e: Vec<&str> = expected.lines().collect();
    let g: Vec<&str> = got.lines().collect();
    let same = e.iter().zip(&g).take_while(|(a, b)| a == b).count();
    let mut out = format!("first difference at line {} of the kernel:\n", same + 1);
    for l in &e[same..] {
        out.push_str(&format!("- {l}\n"));
    }
    for l in &g[same..] {
        out.push_str(&format!("+ {l}\n"));
    }
    out
}

/// `; launch grid=X[,Y[,Z]] block=X[,Y[,Z]] [shared=BYTES]`
fn launch_config(ft: &FileTest) -> Result<LaunchConfig, String> {
    let d = ft.one("launch")?.ok_or("no `; launch grid=.. block=..` line")?;
    let bad = |why: String| format!("line {}: {why}", d.line);
    let dims = |s: &str| -> Result<[u32; 3], String> {
        let parts: Vec<&str> = s.split(',').collect();
        if parts.len() > 3 {
            return Err(bad(format!("`{s}` has more than 3 dimensions")));
        }
        let mut out = [1u32; 3];
        for (o, p) in out.iter_mut().zip(&parts) {
            *o = p.trim().parse().map_err(|_| bad(format!("`{p}` is not a dimension")))?;
        }
        Ok(out)
    };
    let (mut grid, mut block, mut shared) = (None, None, 0);
    for item in d.value.split_whitespace() {
        match item.split_once('=') {
            Some(("grid", v)) => grid = Some(dims(v)?),
            Some(("block", v)) => block = Some(dims(v)?),
            Some(("shared", v)) => shared = v.parse().map_err(|_| bad(format!("`{v}` is not a byte count")))?,
            _ => return Err(bad(format!("`{item}`: expected grid=, block= or shared="))),
        }
    }
    Ok(LaunchConfig {
        grid: grid.ok_or_else(|| bad("no grid=".into()))?,
        block: block.ok_or_else(|| bad("no block=".into()))?,
        dynamic_shared_bytes: shared,
    })
}

/// `%N = rest`
fn split_value(value: &str, line: usize) -> Result<(Value, &str), String> {
    let (lhs, rhs) = value.split_once('=').ok_or_else(|| format!("line {line}: expected `%N = ...`"))?;
    let n = lhs.trim().strip_prefix('%').and_then(|n| n.parse().ok());
    let n = n.ok_or_else(|| format!("line {line}: `{}` is not a value such as %0", lhs.trim()))?;
    Ok((Value(n), rhs.trim()))
}

/// The contents of a buffer: `ty[len] e0 e1 ...` (one element fills the whole buffer).
fn buffer(text: &str, line: usize) -> Result<(ScalarType, Vec<u8>), String> {
    let mut words = text.split_whitespace();
    let head = words.next().unwrap_or("");
    let bad = |why: String| format!("line {line}: {why}");
    let (ty, len) = head
        .strip_suffix(']')
        .and_then(|h| h.split_once('['))
        .and_then(|(t, n)| Some((ScalarType::from_name(t)?, n.parse::<usize>().ok()?)))
        .ok_or_else(|| bad(format!("`{head}`: expected a buffer such as f32[4]")))?;
    let elems = words.map(|w| element(ty, w).map_err(bad)).collect::<Result<Vec<_>, _>>()?;
    let elems = match elems.len() {
        1 => vec![elems[0]; len],
        n if n == len => elems,
        n => return Err(bad(format!("{ty}[{len}] given {n} elements"))),
    };
    let size = ty.bytes() as usize;
    Ok((ty, elems.iter().flat_map(|bits| bits.to_le_bytes()[..size].to_vec()).collect()))
}

/// One element's bits: decimal (floats rounded to nearest even; `inf`, `nan` allowed) or
/// `0x` hex bits.
fn element(ty: ScalarType, text: &str) -> Result<u64, String> {
    let bad = || format!("`{text}` is not a {ty}");
    let max = if ty.bits() >= 64 { u64::MAX } else { (1 << ty.bits()) - 1 };
    if let Some(hex) = text.strip_prefix("0x") {
        return u64::from_str_radix(hex, 16).ok().filter(|v| *v <= max).ok_or_else(bad);
    }
    let bits = match ty {
        ScalarType::Pred => return Err(format!("{ty} cannot live in memory")),
        ScalarType::F32 => text.parse::<f32>().map_err(|_| bad())?.to_bits() as u64,
        ScalarType::F64 => text.parse::<f64>().map_err(|_| bad())?.to_bits(),
        ScalarType::F16 => half::f16::from_f64(text.parse().map_err(|_| bad())?).to_bits() as u64,
        ScalarType::BF16 => half::bf16::from_f64(text.parse().map_err(|_| bad())?).to_bits() as u64,
        t if t.is_signed_int() => {
            let v: i64 = text.parse().map_err(|_| bad())?;
            let half_range = 1i128 << (t.bits() - 1);
            if (v as i128) < -half_range || (v as i128) >= half_range {
                return Err(bad());
            }
            v as u64 & max
        }
        _ => text.parse::<u64>().ok().filter(|v| *v <= max).ok_or_else(bad)?,
    };
    Ok(bits)
}

/// An element for messages: its value and, for floats, its bits.
fn show(ty: ScalarType, bytes: &[u8]) -> String {
    let mut word = [0u8; 8];
    word[..bytes.len()].copy_from_slice(bytes);
    let bits = u64::from_le_bytes(word);
    match ty {
        ScalarType::F32 => format!("{} (0x{bits:08x})", f32::from_bits(bits as u32)),
        ScalarType::F64 => format!("{} (0x{bits:016x})", f64::from_bits(bits)),
        ScalarType::F16 => format!("{} (0x{bits:04x})", half::f16::from_bits(bits as u16)),
        ScalarType::BF16 => format!("{} (0x{bits:04x})", half::bf16::from_bits(bits as u16)),
        t => Constant::new(t, bits).to_string(),
    }
}

/// `; expect %N = ty[len] ...`: the buffer parameter and its expected contents.
struct Expectation {
    line: usize,
    param: Value,
    ty: ScalarType,
    bytes: Vec<u8>,
}

fn expectations(ft: &FileTest, k: &Kernel) -> Result<Vec<Expectation>, String> {
    ft.all("expect")
        .map(|d| {
            let (param, rest) = split_value(&d.value, d.line)?;
            if !k.params.iter().any(|p| p.value == param) {
                return Err(format!("line {}: {param} is not a kernel parameter", d.line));
            }
            let (ty, bytes) = buffer(rest, d.line)?;
            Ok(Expectation { line: d.line, param, ty, bytes })
        })
        .collect()
}

/// The launch arguments of `; arg` lines, in parameter order.
struct Args {
    /// For each parameter: the index of its buffer, or its scalar.
    slots: Vec<(Value, Result<usize, Constant>)>,
    buffers: Vec<Vec<u8>>,
}

impl Args {
    fn from_header(ft: &FileTest, k: &Kernel) -> Result<Args, String> {
        let mut given = vec![];
        for d in ft.all("arg") {
            let (param, rest) = split_value(&d.value, d.line)?;
            if !k.params.iter().any(|p| p.value == param) {
                return Err(format!("line {}: {param} is not a kernel parameter", d.line));
            }
            if given.iter().any(|(v, _, _)| *v == param) {
                return Err(format!("line {}: a second `arg` for {param}", d.line));
            }
            given.push((param, rest, d.line));
        }
        let mut slots = vec![];
        let mut buffers = vec![];
        for p in &k.params {
            let (_, text, line) = given
                .iter()
                .find(|(v, _, _)| *v == p.value)
                .ok_or_else(|| format!("no `; arg {} = ...` for parameter `{}`", p.value, p.name))?;
            if text.contains('[') {
                buffers.push(buffer(text, *line)?.1);
                slots.push((p.value, Ok(buffers.len() - 1)));
            } else {
                let (ty, v) = text.split_once(char::is_whitespace).unwrap_or((text, ""));
                let ty =
                    ScalarType::from_name(ty).ok_or_else(|| format!("line {line}: `{ty}` is not a scalar type"))?;
                let bits = element(ty, v.trim()).map_err(|e| format!("line {line}: {e}"))?;
                slots.push((p.value, Err(Constant::new(ty, bits))));
            }
        }
        Ok(Args { slots, buffers })
    }

    fn args(&mut self) -> Vec<KernelArg<'_>> {
        let mut bufs = self.buffers.iter_mut();
        let mut args: Vec<KernelArg<'_>> = vec![];
        for (_, slot) in &self.slots {
            args.push(match slot {
                Ok(_) => KernelArg::Buffer(bufs.next().expect("one buffer per buffer slot")),
                Err(c) => KernelArg::Scalar(*c),
            });
        }
        args
    }

    fn run(&mut self, k: &Kernel, launch: &LaunchConfig) -> Result<(), String> {
        run(k, launch, &mut self.args()).map_err(|e| e.to_string())
    }

    fn run_profiled(&mut self, k: &Kernel, launch: &LaunchConfig, threads: usize) -> Result<Profile, String> {
        run_profiled(k, launch, &mut self.args(), threads).map_err(|e| e.to_string())
    }

    fn check(&self, expectations: &[Expectation]) -> Result<(), String> {
        for e in expectations {
            let Some((_, Ok(index))) = self.slots.iter().find(|(v, _)| *v == e.param) else {
                return Err(format!("line {}: {} is not a buffer argument", e.line, e.param));
            };
            let got = &self.buffers[*index];
            if got.len() != e.bytes.len() {
                return Err(format!(
                    "line {}: {} has {} bytes, the expectation {}",
                    e.line,
                    e.param,
                    got.len(),
                    e.bytes.len()
                ));
            }
            let size = e.ty.bytes() as usize;
            let wrong: Vec<String> = got
                .chunks(size)
                .zip(e.bytes.chunks(size))
                .enumerate()
                .filter(|(_, (g, x))| g != x)
                .map(|(i, (g, x))| format!("  [{i}]: got {}, expected {}", show(e.ty, g), show(e.ty, x)))
                .collect();
            if !wrong.is_empty() {
                let shown = wrong.iter().take(16).cloned().collect::<Vec<_>>().join("\n");
                return Err(format!("line {}: {} differs in {} elements:\n{shown}", e.line, e.param, wrong.len()));
            }
        }
        Ok(())
    }
}
