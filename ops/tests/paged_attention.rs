//! The paged KV cache's plan and data movement against host references: `append` scatters rows
//! to the slots the block tables name, `gather_into` rebuilds the contiguous cache, and every
//! invalid plan is refused with a message naming what is wrong.

use crate::common::*;
use ruda_ops::api::paged_attention::{DevicePlan, HostPlan, PlanCapacity};
use ruda_ops::api::OpError;
use ruda_runtime::{DType, Tensor};

/// A plan of ragged sequences over shuffled pages: sequence `s` of `lengths[s]` positions
/// (this step appends its last `new[s]`), its pages drawn without repetition from a permutation.
fn ragged(page_size: usize, lengths: &[u32], new: &[u32], rng: &mut Rng) -> HostPlan {
    let needed: usize = lengths.iter().map(|&l| (l as usize).div_ceil(page_size)).sum();
    let pages = needed + 3;
    let mut perm: Vec<u32> = (0..pages as u32).collect();
    for i in (1..perm.len()).rev() {
        perm.swap(i, rng.next_u64() as usize % (i + 1));
    }
    let mut next = perm.into_iter();
    let tables: Vec<Vec<u32>> = lengths
        .iter()
        .map(|&l| (0..(l as usize).div_ceil(page_size)).map(|_| next.next().unwrap()).collect())
        .collect();
    let (mut ids, mut pos) = (vec![], vec![]);
    for (s, (&l, &n)) in lengths.iter().zip(new).enumerate() {
        for p in l - n..l {
            ids.push(s as u32);
            pos.push(p);
        }
    }
    HostPlan::new(page_size, pages, &tables, lengths, &ids, &pos).unwrap()
}

/// The cache row of `position` of sequence `s` in `tables`.
fn cache_row(tables: &[Vec<u32>], page_size: usize, s: usize, position: usize) -> usize {
    tables[s][position / page_size] as usize * page_size + position % page_size
}

#[test]
fn append_then_gather_match_the_host_reference() {
    let device = device();
    let mut rng = Rng::new(14);
    for (page_size, dtype, heads, d, dv) in
        [(1, DType::F32, 2, 8, 4), (4, DType::F16, 1, 40, 24), (16, DType::BF16, 3, 5, 7), (4, DType::F32, 2, 128, 72)]
    {
        let lengths = [5u32, 1, 17, 9];
        let new = [5u32, 1, 1, 3];
        let plan = ragged(page_size, &lengths, &new, &mut rng);
        let q = Tensor::zeros(&device, dtype, &[1]).unwrap();
        let dev = DevicePlan::upload(&plan, &q).unwrap();
        let rows = plan.pages() * page_size;
        let kc0 = quantize(dtype, &rng.vec(rows * heads * d, -1.0, 1.0));
        let vc0 = quantize(dtype, &rng.vec(rows * heads * dv, -1.0, 1.0));
        let nq = plan.queries();
        let k = quantize(dtype, &rng.vec(nq * heads * d, -1.0, 1.0));
        let v = quantize(dtype, &rng.vec(nq * heads * dv, -1.0, 1.0));
        let key_cache = tensor(&device, dtype, &kc0, &[plan.pages(), page_size, heads, d]);
        let value_cache = tensor(&device, dtype, &vc0, &[plan.pages(), page_size, heads, dv]);
        let (kt, vt) = (tensor(&device, dtype, &k, &[nq, heads, d]), tensor(&device, dtype, &v, &[nq, heads, dv]));
        let (key_cache, value_cache) = dev.append(&kt, &vt, key_cache, value_cache).unwrap();

        // Host reference: the plan's slots, from the inputs the plan was built with.
        let (ids, pos, host_tables) = plan_inputs(&plan, &lengths, &new, page_size);
        let (mut kc, mut vc) = (kc0.clone(), vc0.clone());
        for i in 0..nq {
            let r = cache_row(&host_tables, page_size, ids[i], pos[i]);
            kc[r * heads * d..][..heads * d].copy_from_slice(&k[i * heads * d..][..heads * d]);
            vc[r * heads * dv..][..heads * dv].copy_from_slice(&v[i * heads * dv..][..heads * dv]);
        }
        assert_bits("key cache", &key_cache.to_f32_vec().unwrap(), &kc);
        assert_bits("value cache", &value_cache.to_f32_vec().unwrap(), &vc);

        // Gather the key cache into [B + 1, Hkv, S_max + 2, D]; untouched positions keep their fill.
        let (b, s_max) = (lengths.len() + 1, plan.max_length() + 2);
        let fill = vec![7.0f32; b * heads * s_max * d];
        let out = tensor(&device, dtype, &fill, &[b, heads, s_max, d]);
        dev.gather_into(&device.default_stream(), &key_cache, &out).unwrap();
        let mut want = fill.clone();
        for (s, &l) in lengths.iter().enumerate() {
            for h in 0..heads {
                for t in 0..l as usize {
                    let r = cache_row(&host_tables, page_size, s, t);
                    want[((s * heads + h) * s_max + t) * d..][..d].copy_from_slice(&kc[(r * heads + h) * d..][..d]);
                }
            }
        }
        assert_bits("gathered keys", &out.to_f32_vec().unwrap(), &want);
        assert_eq!(dev.lengths().to_vec::<u32>().unwrap(), lengths.to_vec());
    }
}

/// The sequence id and position of each query and the block tables, read back from the gather
/// of a cache whose row `r` holds `r` (so the reference does not use the plan's own slots).
fn plan_inputs(
    plan: &HostPlan,
    lengths: &[u32],
    new: &[u32],
    page_size: usize,
) -> (Vec<usize>, Vec<usize>, Vec<Vec<u32>>) {
    let device = device();
    let rows = plan.pages() * page_size;
    let cache =
        Tensor::from_slice(&device, &(0..rows).map(|r| r as f32).collect::<Vec<_>>(), &[plan.pages(), page_size, 1, 1])
            .unwrap();
    let q = Tensor::zeros(&device, DType::F32, &[1]).unwrap();
    let dev = DevicePlan::upload(plan, &q).unwrap();
    let s_max = plan.max_length();
    let out = Tensor::zeros(&device, DType::F32, &[lengths.len(), 1, s_max, 1]).unwrap();
    dev.gather_into(&device.default_stream(), &cache, &out).unwrap();
    let got = out.to_vec::<f32>().unwrap();
    let mut tables = vec![];
    for (s, &l) in lengths.iter().enumerate() {
        let mut t = vec![];
        for p in (0..l as usize).step_by(page_size) {
            let r = got[s * s_max + p] as usize;
            assert_eq!(r % page_size, 0, "position {p} of sequence {s} starts a page");
            t.push((r / page_size) as u32);
        }
        for p in 0..l as usize {
            assert_eq!(got[s * s_max + p] as usize, t[p / page_size] as usize * page_size + p % page_size);
        }
        tables.push(t);
    }
    let (mut ids, mut pos) = (vec![], vec![]);
    for (s, (&l, &n)) in lengths.iter().zip(new).enumerate() {
        for p in l - n..l {
            ids.push(s);
            pos.push(p as usize);
        }
    }
    (ids, pos, tables)
}

#[test]
fn append_copies_a_shared_cache_and_writes_an_unshared_one_in_place() {
    let device = device();
    let plan = HostPlan::new(2, 2, &[vec![1]], &[1], &[0], &[0]).unwrap();
    let q = Tensor::zeros(&device, DType::F32, &[1]).unwrap();
    let dev = DevicePlan::upload(&plan, &q).unwrap();
    let k = Tensor::from_slice(&device, &[5.0f32, 6.0], &[1, 1, 2]).unwrap();
    let v = Tensor::from_slice(&device, &[7.0f32], &[1, 1, 1]).unwrap();
    let kc = Tensor::zeros(&device, DType::F32, &[2, 2, 1, 2]).unwrap();
    let vc = Tensor::zeros(&device, DType::F32, &[2, 2, 1, 1]).unwrap();
    let kept = kc.clone();
    let (kc2, vc2) = dev.append(&k, &v, kc, vc).unwrap();
    assert_eq!(kept.to_vec::<f32>().unwrap(), vec![0.0; 8], "the other handle must not see the write");
    assert_eq!(kc2.to_vec::<f32>().unwrap(), vec![0.0, 0.0, 0.0, 0.0, 5.0, 6.0, 0.0, 0.0]);
    assert!(!kc2.buffer().same_memory(kept.buffer()));
    let address = vc2.buffer().address();
    assert_eq!(vc2.to_vec::<f32>().unwrap(), vec![0.0, 0.0, 7.0, 0.0]);
    let (_, vc3) = dev.append(&k, &v, kc2, vc2).unwrap();
    assert_eq!(vc3.buffer().address(), address, "an unshared cache is written in place");
}

#[test]
fn update_reuses_the_buffers_and_refuses_what_does_not_fit() {
    let device = device();
    let q = Tensor::zeros(&device, DType::F32, &[1]).unwrap();
    let first = HostPlan::new(4, 8, &[vec![3], vec![5, 6]], &[2, 6], &[0, 1], &[1, 5]).unwrap();
    let cap = PlanCapacity { queries: 4, sequences: 3, pages_per_sequence: 2 };
    let mut dev = DevicePlan::upload_with_capacity(&first, &q, cap).unwrap();
    assert_eq!(dev.lengths().to_vec::<u32>().unwrap(), vec![2, 6, 0]);
    let address = dev.lengths().buffer().address();
    let second = HostPlan::new(4, 8, &[vec![7]], &[3], &[0], &[2]).unwrap();
    dev.update(&second).unwrap();
    assert_eq!(dev.lengths().to_vec::<u32>().unwrap(), vec![3, 0, 0]);
    assert_eq!(dev.lengths().buffer().address(), address);
    // After the update, append writes the new plan's slot: page 7, slot 2.
    let k = Tensor::from_slice(&device, &[9.0f32], &[1, 1, 1]).unwrap();
    let v = Tensor::from_slice(&device, &[8.0f32], &[1, 1, 1]).unwrap();
    let kc = Tensor::zeros(&device, DType::F32, &[8, 4, 1, 1]).unwrap();
    let vc = Tensor::zeros(&device, DType::F32, &[8, 4, 1, 1]).unwrap();
    let (kc, _) = dev.append(&k, &v, kc, vc).unwrap();
    let got = kc.to_vec::<f32>().unwrap();
    assert_eq!(got.iter().position(|&x| x == 9.0), Some(7 * 4 + 2));

    let too_many = HostPlan::new(4, 8, &[vec![0, 1, 2]], &[12], &[0], &[11]).unwrap();
    let e = dev.update(&too_many).unwrap_err().to_string();
    assert!(e.contains("pages per sequence") && e.contains("capacity of 2"), "{e}");
    let other = HostPlan::new(2, 8, &[vec![0]], &[1], &[0], &[0]).unwrap();
    let e = dev.update(&other).unwrap_err().to_string();
    assert!(e.contains("8 pages of 4 positions") && e.contains("8 of 2"), "{e}");
    let e = DevicePlan::upload_with_capacity(&first, &q, PlanCapacity { queries: 1, ..cap }).err().unwrap().to_string();
    assert!(e.contains("2 queries") && e.contains("capacity of 1"), "{e}");
}

#[test]
fn host_plan_refuses_every_invalid_layout() {
    let t = |x: &[u32]| x.to_vec();
    let cases: Vec<(std::result::Result<HostPlan, OpError>, &str)> = vec![
        (HostPlan::new(0, 4, &[t(&[0])], &[1], &[0], &[0]), "page_size (0)"),
        (HostPlan::new(4, 0, &[t(&[0])], &[1], &[0], &[0]), "pages (0)"),
        (HostPlan::new(4, 4, &[t(&[0])], &[1, 2], &[0], &[0]), "1 block tables for 2 lengths"),
        (HostPlan::new(4, 4, &[], &[], &[], &[]), "no sequences"),
        (HostPlan::new(4, 4, &[t(&[0])], &[1], &[0], &[]), "1 sequence ids for 0 positions"),
        (HostPlan::new(4, 4, &[t(&[0])], &[1], &[], &[]), "no queries"),
        (HostPlan::new(4, 4, &[t(&[0, 4])], &[5], &[0], &[0]), "sequence 0: entry 1 is page 4, past the 4 pages"),
        (HostPlan::new(4, 4, &[t(&[0])], &[5], &[0], &[0]), "has 1 pages; its length 5 needs 2"),
        (HostPlan::new(4, 4, &[t(&[0])], &[1], &[1], &[0]), "query 0: sequence id 1 is past the 1 sequences"),
        (HostPlan::new(4, 4, &[t(&[0])], &[3], &[0], &[3]), "query 0: position 3 is not below the length 3"),
        (
            HostPlan::new(4, 4, &[t(&[0]), t(&[1])], &[2, 2], &[0, 0], &[1, 1]),
            "queries 0 and 1 both write page 0, slot 1",
        ),
        // Two sequences sharing a page (a prefix) and both writing its slot 2.
        (HostPlan::new(4, 4, &[t(&[2]), t(&[2])], &[3, 3], &[0, 1], &[2, 2]), "both write page 2, slot 2"),
        (HostPlan::new(1 << 20, 1 << 13, &[t(&[0])], &[1], &[0], &[0]), "exceed u32 rows"),
    ];
    for (got, want) in cases {
        let e = got.err().unwrap_or_else(|| panic!("accepted; expected an error containing {want:?}")).to_string();
        assert!(e.contains(want), "{e:?} does not contain {want:?}");
    }
    // Shared prefix pages are fine for reading: only writes must not collide.
    let ok = HostPlan::new(4, 4, &[t(&[2, 0]), t(&[2, 1])], &[5, 6], &[0, 1], &[4, 5]).unwrap();
    assert_eq!((ok.queries(), ok.sequences(), ok.max_pages_per_sequence(), ok.max_length()), (2, 2, 2, 6));
}

#[test]
fn append_and_gather_refuse_mismatched_tensors() {
    let device = device();
    let q = Tensor::zeros(&device, DType::F32, &[1]).unwrap();
    let plan = HostPlan::new(2, 3, &[vec![1]], &[2], &[0], &[1]).unwrap();
    let dev = DevicePlan::upload(&plan, &q).unwrap();
    let z = |dtype, shape: &[usize]| Tensor::zeros(&device, dtype, shape).unwrap();
    let stream = device.default_stream();
    let (k, v) = (z(DType::F32, &[1, 2, 4]), z(DType::F32, &[1, 2, 3]));
    let (kc, vc) = (z(DType::F32, &[3, 2, 2, 4]), z(DType::F32, &[3, 2, 2, 3]));
    dev.append_into(&stream, &k, &v, &kc, &vc).unwrap();
    let cases: Vec<(Result<(), OpError>, &str)> = vec![
        (
            dev.append_into(&stream, &k, &v, &z(DType::F32, &[4, 2, 2, 4]), &vc),
            "`key_cache` must be [pages = 3, page_size = 2",
        ),
        (
            dev.append_into(&stream, &k, &v, &kc, &z(DType::F32, &[3, 2, 1, 3])),
            "`key_cache` has 2 kv heads, `value_cache` 1",
        ),
        (dev.append_into(&stream, &z(DType::F32, &[2, 2, 4]), &v, &kc, &vc), "`k`"),
        (dev.append_into(&stream, &k, &z(DType::F32, &[1, 2, 4]), &kc, &vc), "`v`"),
        (dev.append_into(&stream, &z(DType::F16, &[1, 2, 4]), &v, &kc, &vc), "`k`"),
        (dev.append_into(&stream, &k, &v, &kc, &z(DType::BF16, &[3, 2, 2, 3])), "value_cache"),
        (dev.append_into(&stream, &k, &k, &kc, &kc), "share one allocation"),
        (dev.append_into(&stream, &k, &v, &z(DType::U32, &[3, 2, 2, 4]), &vc), "dtype"),
        (dev.gather_into(&stream, &kc, &z(DType::F32, &[1, 2, 1, 4])), "at least 2 positions"),
        (dev.gather_into(&stream, &kc, &z(DType::F32, &[1, 1, 2, 4])), "2 kv heads"),
        (dev.gather_into(&stream, &kc, &z(DType::F16, &[1, 2, 2, 4])), "`out`"),
    ];
    for (got, want) in cases {
        let e = got.err().unwrap_or_else(|| panic!("accepted; expected an error containing {want:?}")).to_string();
        assert!(e.contains(want), "{e:?} does not contain {want:?}");
    }
}
