//! `RUDA_INTERP_THREADS` (alone in this test binary: it changes the process environment).

use ruda_ir::interp::{run, KernelArg, LaunchConfig, THREADS_ENV};
use ruda_ir::{AddrSpace, KernelBuilder, ScalarType, Type};

#[test]
fn thread_count_comes_from_the_environment() {
    let mut b = KernelBuilder::new("ids");
    let out = b.param("out", Type::Ptr(AddrSpace::Global, ScalarType::U32));
    let g = b.global_thread_id_x();
    let p = b.ptr_add(out, g);
    b.store(p, g);
    let k = b.finish().unwrap();
    let cfg = LaunchConfig::linear(16, 32);
    for bad in ["0", "many", "-1"] {
        std::env::set_var(THREADS_ENV, bad);
        let mut buf = vec![0u8; 4 * 512];
        let e = run(&k, &cfg, &mut [KernelArg::Buffer(&mut buf)]).unwrap_err();
        assert!(e.to_string().contains("RUDA_INTERP_THREADS must be a positive integer"), "{e}");
    }
    for good in ["1", "3"] {
        std::env::set_var(THREADS_ENV, good);
        let mut buf = vec![0u8; 4 * 512];
        run(&k, &cfg, &mut [KernelArg::Buffer(&mut buf)]).unwrap();
        let ids: Vec<u32> = buf.chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(ids, (0..512).collect::<Vec<u32>>());
    }
    std::env::remove_var(THREADS_ENV);
}
