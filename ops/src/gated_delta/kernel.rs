//! The gated delta rule's kernels: token by token ([`gated_delta`]) and by chunks in the WY
//! representation ([`gated_delta_chunk`]). The math is in the [module](super) documentation.
//!
//! Both launch one block per (V tile, value head, sequence): grid `[ceil(V / V_TILE), Hv, B]`
//! (`B` the sequences, packed or not),
//! [`V_TILE`] threads, thread `x` owning column `tile · V_TILE + x` of the head's `[K, V]` state,
//! which lives in shared memory in `f32` (`state[a · V_TILE + x]`, so a warp's accesses are
//! consecutive). Every thread reads the same `q`/`k` rows straight from global memory (the
//! caches serve the repeats).

use ruda_ir::{Kernel, KernelBuilder, ScalarType, SpecialReg, Value, VerifyError};

use crate::blocks::{load_f32, row_ptr, store_from_f32};

/// Columns of the state (and threads) per block.
pub const V_TILE: u32 = 32;

/// Static shared memory a kernel may use on every CUDA device (larger needs the dynamic,
/// opt-in window, which these kernels do not use yet).
pub const STATIC_SHARED_LIMIT: u32 = 48 * 1024;

/// One gated delta configuration: the dtype of `q`/`k`/`v`/output, the dtype of `beta` and
/// `log_decay` (the same or `f32`), and the head dims.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GatedDeltaConfig {
    pub dtype: ScalarType,
    pub gate_dtype: ScalarType,
    pub k_dim: u32,
    pub v_dim: u32,
    /// Packed variable-length sequences: tokens `[total, H, ·]`, sequence `s` owning tokens
    /// `cu_seqlens[s]..cu_seqlens[s + 1]`, instead of `[B, H, T, ·]`.
    pub packed: bool,
    /// The states live in a pool, `state_pool [slots, Hv, K, V]` (`f32`), sequence `s` reading
    /// and updating `state_pool[state_slots[s]]` in place, instead of `initial_state` and
    /// `final_state`. In place is safe: each block reads and writes only its own columns of
    /// its own slot (the caller keeps the slots of one launch distinct).
    pub slots: bool,
}

impl GatedDeltaConfig {
    fn suffix(&self) -> String {
        let gate = if self.gate_dtype == self.dtype { String::new() } else { format!(".g{}", self.gate_dtype) };
        format!("{}{gate}.k{}.v{}", self.dtype, self.k_dim, self.v_dim)
    }

    /// `_varlen` packed, then `_slots` over a state pool.
    fn varlen(&self) -> String {
        format!("{}{}", if self.packed { "_varlen" } else { "" }, if self.slots { "_slots" } else { "" })
    }

    /// `gated_delta.bf16.k128.v128`, `gated_delta.bf16.gf32.k128.v128` (`f32` gates),
    /// `gated_delta_varlen.bf16.k128.v128` (packed), `gated_delta_slots.bf16.k128.v128` (over a
    /// state pool).
    pub fn id(&self) -> String {
        format!("gated_delta{}.{}", self.varlen(), self.suffix())
    }

    /// `gated_delta_chunk.bf16.k128.v128.c64`: the chunked kernel for chunks of `chunk`
    /// (`gated_delta_chunk_varlen...` packed).
    pub fn chunk_id(&self, chunk: u32) -> String {
        format!("gated_delta_chunk{}.{}.c{chunk}", self.varlen(), self.suffix())
    }

    /// Blocks along V.
    pub fn v_tiles(&self) -> u32 {
        self.v_dim.div_ceil(V_TILE)
    }

    /// Static shared bytes of the recurrent kernel: the state tile.
    pub fn shared_bytes(&self) -> u64 {
        4 * self.k_dim as u64 * V_TILE as u64
    }

    /// Static shared bytes of the chunked kernel for chunks of `chunk`: the triangular
    /// workspace `4 · (C² + C)` (`C` rows of the matrix and the row's in-chunk decay sum), the state tile
    /// and the chunk's corrected values (`C × V_TILE`).
    pub fn chunk_shared_bytes(&self, chunk: u32) -> u64 {
        let c = chunk as u64;
        workspace_bytes(chunk) + self.shared_bytes() + 4 * c * V_TILE as u64
    }
}

/// The triangular workspace of chunks of `chunk`: `4 · (C² + C)` bytes.
pub fn workspace_bytes(chunk: u32) -> u64 {
    let c = chunk as u64;
    4 * (c * c + c)
}

crate::kernel_params! {
    /// The parameters of [`gated_delta`] and [`gated_delta_chunk`], in order.
    pub struct GatedDeltaParams, GatedDeltaValues for GatedDeltaConfig as cfg {
        query: tensor(cfg.dtype),
        key: tensor(cfg.dtype),
        value: tensor(cfg.dtype),
        beta: tensor(cfg.gate_dtype),
        log_decay: tensor(cfg.gate_dtype),
        initial_state: opt_tensor(ScalarType::F32, !cfg.slots),
        output: tensor(cfg.dtype),
        final_state: opt_tensor(ScalarType::F32, !cfg.slots),
        state_pool: opt_tensor(ScalarType::F32, cfg.slots),
        state_slots: opt_tensor(ScalarType::U32, cfg.slots),
        cu_seqlens: opt_tensor(ScalarType::U32, cfg.packed),
        key_heads: scalar(u32),
        value_heads: scalar(u32),
        seq_len: opt_scalar(u32, !cfg.packed),
        query_scale: scalar(f32),
        pool_slots: opt_scalar(u32, cfg.slots),
    }
}

/// `e^x` as `2^(x · log2 e)` (one approximate `ex2`).
#[track_caller]
fn exp(b: &mut KernelBuilder, x: Value) -> Value {
    let log2e = b.const_f32(std::f32::consts::LOG2_E);
    let t = b.mul(x, log2e);
    b.ex2(t)
}

/// `Σ_a x[a] · y[a]` over `a < n` for two `f32`-widened rows.
#[track_caller]
fn dot(b: &mut KernelBuilder, x: Value, y: Value, n: u32) -> Value {
    let zero = b.const_u32(0);
    let end = b.const_u32(n);
    let one = b.const_u32(1);
    let init = b.const_f32(0.0);
    b.for_range(zero, end, one, &[init], |b, a, acc| {
        let xa = load_f32(b, x, a);
        let ya = load_f32(b, y, a);
        vec![b.fma(xa, ya, acc[0])]
    })[0]
}

/// What both kernels share: the block's head, its rows of every tensor, and its state tile.
struct Head {
    tid: Value,
    /// This thread's column of V.
    col: Value,
    /// Whether `col < V`.
    active: Value,
    /// Row pointers of the head: `q`/`k` of its key head, `v`/output, gates.
    q: Value,
    k: Value,
    v: Value,
    out: Value,
    beta: Value,
    g: Value,
    init: Value,
    fin: Value,
    /// Elements between consecutive tokens of `q`/`k`, of `v`/output and of the gates.
    qk_stride: Value,
    v_stride: Value,
    g_stride: Value,
    /// The shared state tile `[K, V_TILE]`.
    state: Value,
    seq_len: Value,
    scale: Value,
}

#[track_caller]
fn head(b: &mut KernelBuilder, cfg: &GatedDeltaConfig, p: &GatedDeltaValues) -> Head {
    let tile = b.block_id_x();
    let h = b.block_id_y();
    let seq = b.special(SpecialReg::CtaidZ);
    let tid = b.thread_id_x();
    let vt = b.const_u32(V_TILE);
    let col = b.fma(tile, vt, tid);
    let vdim = b.const_u32(cfg.v_dim);
    let mut active = b.lt(col, vdim);
    // Value head h reads key head h / (Hv / Hk).
    let group = b.div(p.value_heads, p.key_heads);
    let kh = b.div(h, group);
    let khead = b.fma(seq, p.key_heads, kh);
    let vhead = b.fma(seq, p.value_heads, h);
    let kd = b.const_u32(cfg.k_dim);
    let kv = b.const_u32(cfg.k_dim * cfg.v_dim);
    let state_id = b.shared_array("state", ScalarType::F32, cfg.k_dim * V_TILE);
    let state = b.shared_ptr(state_id);
    let (init, fin) = match (p.initial_state, p.final_state, p.state_pool, p.state_slots) {
        (Some(init), Some(fin), None, None) => (row_ptr(b, init, vhead, kv), row_ptr(b, fin, vhead, kv)),
        (None, None, Some(pool), Some(slots)) => {
            // The sequence's state is row state_slots[seq] · Hv + h of the pool, read and written.
            let at = b.ptr_add(slots, seq);
            let slot = b.load(at);
            // A slot past the pool leaves its sequence alone (its output unwritten) instead of
            // writing out of bounds: the host cannot check device-side slots without a read.
            let pool_slots = p.pool_slots.expect("a pool configuration declares pool_slots");
            let inside = b.lt(slot, pool_slots);
            active = b.and(active, inside);
            let row = b.fma(slot, p.value_heads, h);
            let state = row_ptr(b, pool, row, kv);
            (state, state)
        }
        _ => unreachable!("a configuration declares either the two states or the pool and its slots"),
    };
    let (q, k, v, out, beta, g, seq_len, qk_stride, v_stride, g_stride) = match (p.cu_seqlens, p.seq_len) {
        (Some(cu), _) => {
            // Token t of the sequence is row start + t of [total, H, ·].
            let at = b.ptr_add(cu, seq);
            let start = b.load(at);
            let one = b.const_u32(1);
            let next = b.add(seq, one);
            let at = b.ptr_add(cu, next);
            let end = b.load(at);
            let len = b.sub(end, start);
            let krow = b.fma(start, p.key_heads, kh);
            let vrow = b.fma(start, p.value_heads, h);
            let qk_stride = b.mul(p.key_heads, kd);
            let v_stride = b.mul(p.value_heads, vdim);
            (
                row_ptr(b, p.query, krow, kd),
                row_ptr(b, p.key, krow, kd),
                row_ptr(b, p.value, vrow, vdim),
                row_ptr(b, p.output, vrow, vdim),
                row_ptr(b, p.beta, vrow, one),
                row_ptr(b, p.log_decay, vrow, one),
                len,
                qk_stride,
                v_stride,
                p.value_heads,
            )
        }
        (None, Some(seq_len)) => {
            let tk = b.mul(seq_len, kd);
            let tv = b.mul(seq_len, vdim);
            let one = b.const_u32(1);
            (
                row_ptr(b, p.query, khead, tk),
                row_ptr(b, p.key, khead, tk),
                row_ptr(b, p.value, vhead, tv),
                row_ptr(b, p.output, vhead, tv),
                row_ptr(b, p.beta, vhead, seq_len),
                row_ptr(b, p.log_decay, vhead, seq_len),
                seq_len,
                kd,
                vdim,
                one,
            )
        }
        (None, None) => unreachable!("a dense configuration declares seq_len"),
    };
    Head {
        tid,
        col,
        active,
        q,
        k,
        v,
        out,
        beta,
        g,
        init,
        fin,
        qk_stride,
        v_stride,
        g_stride,
        state,
        seq_len,
        scale: p.query_scale,
    }
}

impl Head {
    /// The `q` or `k` row of token `t` (`base` = `self.q` or `self.k`).
    #[track_caller]
    fn token_row(&self, b: &mut KernelBuilder, base: Value, t: Value) -> Value {
        let e = b.mul(t, self.qk_stride);
        b.ptr_add(base, e)
    }

    /// The index of this thread's value (and output) of token `t`.
    #[track_caller]
    fn value_index(&self, b: &mut KernelBuilder, t: Value) -> Value {
        b.fma(t, self.v_stride, self.col)
    }

    /// A gate (`self.beta` or `self.g`) of token `t`, in `f32`.
    #[track_caller]
    fn gate(&self, b: &mut KernelBuilder, base: Value, t: Value) -> Value {
        let e = b.mul(t, self.g_stride);
        load_f32(b, base, e)
    }

    /// Element `a` of this thread's state column in shared memory.
    #[track_caller]
    fn state_at(&self, b: &mut KernelBuilder, a: Value) -> Value {
        let vt = b.const_u32(V_TILE);
        let i = b.fma(a, vt, self.tid);
        b.ptr_add(self.state, i)
    }

    /// Element `a` of this thread's column of a `[K, V]` state in global memory.
    #[track_caller]
    fn global_at(&self, b: &mut KernelBuilder, cfg: &GatedDeltaConfig, base: Value, a: Value) -> Value {
        let vdim = b.const_u32(cfg.v_dim);
        let i = b.fma(a, vdim, self.col);
        b.ptr_add(base, i)
    }

    /// Load the initial state's column into shared memory.
    #[track_caller]
    fn load_state(&self, b: &mut KernelBuilder, cfg: &GatedDeltaConfig) {
        let (zero, one, kd) = (b.const_u32(0), b.const_u32(1), b.const_u32(cfg.k_dim));
        b.for_each(zero, kd, one, |b, a| {
            let src = self.global_at(b, cfg, self.init, a);
            let s = b.load(src);
            let dst = self.state_at(b, a);
            b.store(dst, s);
        });
    }

    /// Write the state's column to the final state.
    #[track_caller]
    fn store_state(&self, b: &mut KernelBuilder, cfg: &GatedDeltaConfig) {
        let (zero, one, kd) = (b.const_u32(0), b.const_u32(1), b.const_u32(cfg.k_dim));
        b.for_each(zero, kd, one, |b, a| {
            let src = self.state_at(b, a);
            let s = b.load(src);
            let dst = self.global_at(b, cfg, self.fin, a);
            b.store(dst, s);
        });
    }

    /// `Σ_a row[a] · S[a, col]` for a `[K]` row in global memory.
    #[track_caller]
    fn row_times_state(&self, b: &mut KernelBuilder, cfg: &GatedDeltaConfig, row: Value) -> Value {
        let (zero, one, kd) = (b.const_u32(0), b.const_u32(1), b.const_u32(cfg.k_dim));
        let init = b.const_f32(0.0);
        b.for_range(zero, kd, one, &[init], |b, a, acc| {
            let x = load_f32(b, row, a);
            let p = self.state_at(b, a);
            let s = b.load(p);
            vec![b.fma(x, s, acc[0])]
        })[0]
    }
}

/// The recurrence token by token. Parameters: query, key `[B, Hk, T, K]`, value, output
/// `[B, Hv, T, V]`, beta, log_decay `[B, Hv, T]`, initial_state, final_state `[B, Hv, K, V]`
/// (`f32`), key_heads, value_heads, seq_len (`T`, `u32`), query_scale (`f32`); packed, tokens
/// `[total, H, ·]` and `cu_seqlens` (`u32 [B + 1]`) after final_state instead of seq_len. Grid
/// `[ceil(V / V_TILE), Hv, B]`, block [`V_TILE`].
///
/// Each thread runs its column alone (no barriers): per token, `acc = Sᵀk` over the old state,
/// `d = β (v − e^g acc)`, then in one pass `S ← e^g S + k d` and `o = Sᵀ q · scale`.
pub fn gated_delta(cfg: &GatedDeltaConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let p = GatedDeltaParams::declare(&mut b, cfg);
    b.launch_bounds(V_TILE, None);
    let h = head(&mut b, cfg, &p);
    let active = h.active;
    b.if_then(active, |b| {
        h.load_state(b, cfg);
        let (zero, one) = (b.const_u32(0), b.const_u32(1));
        let kd = b.const_u32(cfg.k_dim);
        b.for_each(zero, h.seq_len, one, |b, t| {
            let g = h.gate(b, h.g, t);
            let decay = exp(b, g);
            let beta = h.gate(b, h.beta, t);
            let k = h.token_row(b, h.k, t);
            let q = h.token_row(b, h.q, t);
            let acc = h.row_times_state(b, cfg, k);
            let vi = h.value_index(b, t);
            let v = load_f32(b, h.v, vi);
            let predicted = b.mul(decay, acc);
            let err = b.sub(v, predicted);
            let d = b.mul(beta, err);
            let init = b.const_f32(0.0);
            let o = b.for_range(zero, kd, one, &[init], |b, a, o| {
                let p = h.state_at(b, a);
                let s = b.load(p);
                let ka = load_f32(b, k, a);
                let step = b.mul(ka, d);
                let s = b.fma(s, decay, step);
                b.store(p, s);
                let qa = load_f32(b, q, a);
                vec![b.fma(s, qa, o[0])]
            })[0];
            let o = b.mul(o, h.scale);
            store_from_f32(b, h.out, vi, o);
        });
        h.store_state(b, cfg);
    });
    b.finish()
}

/// The recurrence by chunks of `chunk` positions in the WY representation (same parameters,
/// grid and block as [`gated_delta`]). Per chunk of `n ≤ C` valid positions (the last chunk's
/// padding is never touched), with `γ_i` the in-chunk cumulative sum of `g` and `S` the state at
/// the chunk's start:
///
/// 1. `γ` into the workspace's last column; `L[i][j] = −β_i (k_i · k_j) e^(γ_i − γ_j)` for `j < i` into
///    the workspace matrix's strict lower triangle.
/// 2. Forward substitution, row by row (a barrier per row): `M[i][j] = L[i][j] + Σ_(j<m<i)
///    L[i][m] M[m][j]`, written transposed into the free upper triangle, so that
///    `I + M = (I + A)⁻¹` with `A = −L`.
/// 3. Per column: `r_j = β_j (v_j − e^(γ_j) k_jᵀ S)`, then `u = (I + M) r` in place (rows in
///    descending order), the corrected values `v_new`.
/// 4. `P[i][j] = scale (q_i · k_j) e^(γ_i − γ_j)` for `j ≤ i` into the lower triangle and
///    diagonal (disjoint from `M`), then `o_i = scale e^(γ_i) q_iᵀ S + Σ_(j≤i) P[i][j] u_j`.
/// 5. `S ← e^(γ_last) S + Σ_j k_j e^(γ_last − γ_j) u_jᵀ`.
pub fn gated_delta_chunk(cfg: &GatedDeltaConfig, chunk: u32) -> Result<Kernel, VerifyError> {
    let mut kb = KernelBuilder::new(cfg.chunk_id(chunk).replace('.', "_"));
    let p = GatedDeltaParams::declare(&mut kb, cfg);
    kb.launch_bounds(V_TILE, None);
    let h = head(&mut kb, cfg, &p);
    let b = &mut kb;
    // The workspace: C rows of C + 1 floats, the matrix in columns 0..C and γ in column C. A row
    // pitch of C (a multiple of 32 at C = 64) made step 2's transposed stores, one column per
    // lane, hit one bank (32-way conflicts, found by the budgets test); C + 1 spreads them.
    let attn_id = b.shared_array("attn", ScalarType::F32, chunk * (chunk + 1));
    let vnew_id = b.shared_array("vnew", ScalarType::F32, chunk * V_TILE);
    let attn = b.shared_ptr(attn_id);
    let vnew = b.shared_ptr(vnew_id);
    let (zero, one) = (b.const_u32(0), b.const_u32(1));
    let c = b.const_u32(chunk);
    let pitch = b.const_u32(chunk + 1);
    let vt = b.const_u32(V_TILE);
    let kd = b.const_u32(cfg.k_dim);
    let active = h.active;
    let tid = h.tid;
    b.if_then(active, |b| h.load_state(b, cfg));
    // attn[i · (C + 1) + j]
    let at = |b: &mut KernelBuilder, i: Value, j: Value| {
        let e = b.fma(i, pitch, j);
        b.ptr_add(attn, e)
    };
    // This thread's corrected value of position j.
    let vnew_at = |b: &mut KernelBuilder, j: Value| {
        let e = b.fma(j, vt, tid);
        b.ptr_add(vnew, e)
    };
    let gamma_of = |b: &mut KernelBuilder, j: Value| {
        let p = at(b, j, c);
        b.load(p)
    };
    b.for_each(zero, h.seq_len, c, |b, t0| {
        let left = b.sub(h.seq_len, t0);
        let n = b.min(left, c);
        let k_row = |b: &mut KernelBuilder, i: Value| {
            let t = b.add(t0, i);
            h.token_row(b, h.k, t)
        };
        let q_row = |b: &mut KernelBuilder, i: Value| {
            let t = b.add(t0, i);
            h.token_row(b, h.q, t)
        };
        let gate = |b: &mut KernelBuilder, base: Value, i: Value| {
            let t = b.add(t0, i);
            h.gate(b, base, t)
        };
        // 1. γ and L.
        b.for_each(tid, n, vt, |b, j| {
            let end = b.add(j, one);
            let init = b.const_f32(0.0);
            let sum = b.for_range(zero, end, one, &[init], |b, m, acc| {
                let g = gate(b, h.g, m);
                vec![b.add(acc[0], g)]
            })[0];
            let p = at(b, j, c);
            b.store(p, sum);
        });
        b.barrier();
        // The fills walk the workspace's own layout (rows of C + 1), so a warp's stores are
        // consecutive words even where it spans two rows; the lanes past a row's n idle.
        let rows = b.mul(n, pitch);
        b.for_each(tid, rows, vt, |b, e| {
            let i = b.div(e, pitch);
            let j = b.rem(e, pitch);
            let lower = b.lt(j, i);
            b.if_then(lower, |b| {
                let ki = k_row(b, i);
                let kj = k_row(b, j);
                let kk = dot(b, ki, kj, cfg.k_dim);
                let beta = gate(b, h.beta, i);
                let gi = gamma_of(b, i);
                let gj = gamma_of(b, j);
                let dg = b.sub(gi, gj);
                let decay = exp(b, dg);
                let x = b.mul(beta, kk);
                let x = b.mul(x, decay);
                let x = b.neg(x);
                let p = at(b, i, j);
                b.store(p, x);
            });
        });
        b.barrier();
        // 2. M row by row, transposed into the upper triangle: M[i][j] at attn[j · (C + 1) + i].
        // Every lane walks m from 0 (the terms m <= j masked to 0, in the same order as
        // j < m < i) so that the lanes' reads of attn[j · (C + 1) + m] are one row pitch apart,
        // conflict-free; from m = j + 1 they would be C + 2 apart, an even stride (2-way).
        let zero_f = b.const_f32(0.0);
        b.for_each(one, n, one, |b, i| {
            b.for_each(tid, i, vt, |b, j| {
                let p = at(b, i, j);
                let l = b.load(p);
                let m_ij = b.for_range(zero, i, one, &[l], |b, m, acc| {
                    let p = at(b, i, m);
                    let l_im = b.load(p);
                    let p = at(b, j, m);
                    let m_mj = b.load(p);
                    let live = b.gt(m, j);
                    let m_mj = b.select(live, m_mj, zero_f);
                    vec![b.fma(l_im, m_mj, acc[0])]
                })[0];
                let p = at(b, j, i);
                b.store(p, m_ij);
            });
            b.barrier();
        });
        b.if_then(active, |b| {
            // 3. r, then u = (I + M) r from the last row up.
            b.for_each(zero, n, one, |b, j| {
                let kj = k_row(b, j);
                let ks = h.row_times_state(b, cfg, kj);
                let gj = gamma_of(b, j);
                let decay = exp(b, gj);
                let ks = b.mul(decay, ks);
                let t = b.add(t0, j);
                let vi = h.value_index(b, t);
                let v = load_f32(b, h.v, vi);
                let beta = gate(b, h.beta, j);
                let err = b.sub(v, ks);
                let r = b.mul(beta, err);
                let p = vnew_at(b, j);
                b.store(p, r);
            });
            b.for_each(zero, n, one, |b, ii| {
                let last = b.sub(n, one);
                let i = b.sub(last, ii);
                let p = vnew_at(b, i);
                let r_i = b.load(p);
                let u = b.for_range(zero, i, one, &[r_i], |b, j, acc| {
                    let p = at(b, j, i);
                    let m_ij = b.load(p);
                    let p = vnew_at(b, j);
                    let r_j = b.load(p);
                    vec![b.fma(m_ij, r_j, acc[0])]
                })[0];
                b.store(p, u);
            });
        });
        // 4. P into the lower triangle and diagonal (M, in the upper one, is still being read).
        b.for_each(tid, rows, vt, |b, e| {
            let i = b.div(e, pitch);
            let j = b.rem(e, pitch);
            let lower = b.le(j, i);
            b.if_then(lower, |b| {
                let qi = q_row(b, i);
                let kj = k_row(b, j);
                let qk = dot(b, qi, kj, cfg.k_dim);
                let gi = gamma_of(b, i);
                let gj = gamma_of(b, j);
                let dg = b.sub(gi, gj);
                let decay = exp(b, dg);
                let x = b.mul(qk, decay);
                let x = b.mul(x, h.scale);
                let p = at(b, i, j);
                b.store(p, x);
            });
        });
        b.barrier();
        b.if_then(active, |b| {
            b.for_each(zero, n, one, |b, i| {
                let qi = q_row(b, i);
                let qs = h.row_times_state(b, cfg, qi);
                let gi = gamma_of(b, i);
                let decay = exp(b, gi);
                let qs = b.mul(qs, decay);
                let inter = b.mul(qs, h.scale);
                let end = b.add(i, one);
                let o = b.for_range(zero, end, one, &[inter], |b, j, acc| {
                    let p = at(b, i, j);
                    let pij = b.load(p);
                    let p = vnew_at(b, j);
                    let u = b.load(p);
                    vec![b.fma(pij, u, acc[0])]
                })[0];
                let t = b.add(t0, i);
                let vi = h.value_index(b, t);
                store_from_f32(b, h.out, vi, o);
            });
            // 5. The state passes to the next chunk.
            let last = b.sub(n, one);
            let g_last = gamma_of(b, last);
            b.for_each(zero, n, one, |b, j| {
                let gj = gamma_of(b, j);
                let dg = b.sub(g_last, gj);
                let decay = exp(b, dg);
                let p = vnew_at(b, j);
                let u = b.load(p);
                let u = b.mul(u, decay);
                b.store(p, u);
            });
            let decay = exp(b, g_last);
            b.for_each(zero, kd, one, |b, a| {
                let p = h.state_at(b, a);
                let s = b.load(p);
                let s = b.mul(s, decay);
                let s = b.for_range(zero, n, one, &[s], |b, j, acc| {
                    let kj = k_row(b, j);
                    let ka = load_f32(b, kj, a);
                    let p = vnew_at(b, j);
                    let u = b.load(p);
                    vec![b.fma(ka, u, acc[0])]
                })[0];
                b.store(p, s);
            });
        });
        // The next chunk rewrites γ and the workspace.
        b.barrier();
    });
    b.if_then(active, |b| h.store_state(b, cfg));
    kb.finish()
}
