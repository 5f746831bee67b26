//! The devices of each platform, on whatever machine runs the tests: what is there gives a
//! client, what is not is refused with its sentence. libtpu is provisioned like the CPU
//! plugin, so its answer on this machine is checked for real: `.cargo/config.toml` gives the
//! test processes the compile-only environment, with which libtpu on a machine without chips
//! fails at once rather than waiting on a cloud metadata server.

use tessera_runtime::{libtpu_client, tpu_chips, Error, Platform, GPU_PLUGIN_ENV};

#[test]
fn cpu_gives_the_devices_asked_for() {
    for n in [1, 3] {
        assert_eq!(Platform::Cpu.client(n).unwrap().devices().len(), n);
    }
    assert!(matches!(
        Platform::Cpu.client(0),
        Err(Error::InvalidDeviceCount { requested: 0 })
    ));
}

#[test]
fn tpu_without_chips_is_refused_before_libtpu_loads() {
    match tpu_chips() {
        0 => {
            let e = Platform::Tpu.client(1).unwrap_err();
            assert!(matches!(e, Error::NoTpuChips { .. }), "{e:?}");
            assert_eq!(
                e.to_string(),
                "no TPU chips found on this machine (no TPU among the PCI devices in \
                 /sys/bus/pci/devices); the tpu backend runs on a TPU VM, and `tessera \
                 compile --target tpu:TOPOLOGY` compiles for one without chips"
            );
        }
        _ => assert!(!Platform::Tpu.client(1).unwrap().devices().is_empty()),
    }
}

#[test]
fn libtpu_itself_finds_no_chips_here() {
    match tpu_chips() {
        0 => {
            let e = libtpu_client().unwrap_err();
            assert!(matches!(e, Error::TpuClient { .. }), "{e:?}");
            assert_eq!(
                e.to_string(),
                "libtpu found no usable TPU chips: Failed to get global TPU topology."
            );
        }
        _ => assert!(!libtpu_client().unwrap().devices().is_empty()),
    }
}

#[test]
fn gpu_needs_its_plugin_named() {
    match std::env::var_os(GPU_PLUGIN_ENV) {
        None => {
            let e = Platform::Gpu.client(1).unwrap_err();
            assert!(matches!(e, Error::NoGpuPlugin { .. }), "{e:?}");
            assert!(e
                .to_string()
                .starts_with("the gpu backend needs a CUDA PJRT plugin: install the wheel"));
        }
        Some(_) => assert!(!Platform::Gpu.client(1).unwrap().devices().is_empty()),
    }
}
