//! `RUDA_CUDA_GRAPHS`: unset or `on` captures decode steps, `off` does not, anything else is
//! an error naming the variable and its value, on every device. Its own test binary, because it
//! sets the process environment (one test, so no other thread reads it).

use ruda_runtime::{graph_mode, Device, GraphMode, RuntimeError, RUDA_CUDA_GRAPHS};

#[test]
fn ruda_cuda_graphs_is_on_off_or_an_error() {
    std::env::remove_var(RUDA_CUDA_GRAPHS);
    assert_eq!(graph_mode().unwrap(), GraphMode::On, "unset");
    for (value, want) in [("on", GraphMode::On), ("off", GraphMode::Off), ("", GraphMode::On)] {
        std::env::set_var(RUDA_CUDA_GRAPHS, value);
        assert_eq!(graph_mode().unwrap(), want, "{value:?}");
    }
    for value in ["1", "OFF", "yes", "of f"] {
        std::env::set_var(RUDA_CUDA_GRAPHS, value);
        let e = graph_mode().expect_err(value);
        let RuntimeError::InvalidEnv { var, .. } = &e else { panic!("{value}: {e}") };
        assert_eq!(*var, RUDA_CUDA_GRAPHS);
        assert!(e.to_string().contains(&format!("RUDA_CUDA_GRAPHS={value:?}")) && e.to_string().contains("off"), "{e}");
        // The CPU device checks it too.
        std::env::set_var("RUDA_DEVICE", "cpu");
        assert!(Device::from_env().unwrap_err().to_string().contains("RUDA_CUDA_GRAPHS"));
        std::env::remove_var("RUDA_DEVICE");
    }
    std::env::remove_var(RUDA_CUDA_GRAPHS);
}
