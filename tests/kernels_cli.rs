//! The kernels that move their own data from the command line: `tessera kernels` lists them
//! (the ones on a device mesh marked), `tessera run` runs paged attention on .npy files like
//! every kernel and refuses a kernel on a mesh with the sentence naming what runs it, and
//! `tessera ir` prints a collective's IR on its mesh and its SPMD StableHLO.

mod common;

use common::{tessera, Dir};
use tessera::dsl::HostArray;
use tessera::npy::read_npy;
use tessera::registry;

#[test]
fn kernels_lists_the_kernels_that_move_their_own_data() {
    let (ok, out, err) = tessera(&["kernels"]);
    assert!(ok, "{err}");
    let one_device = ["paged_attention", "gather_tiles"];
    let rings = [
        "ring_shift",
        "ring_all_gather",
        "all_gather",
        "all_gather_matmul",
    ];
    for name in one_device.into_iter().chain(rings) {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("{name}  ")))
            .unwrap_or_else(|| panic!("{name} not listed: {out}"));
        let on_mesh = line.contains("[runs on a device mesh");
        assert_eq!(on_mesh, rings.contains(&name), "{line}");
    }
}

/// Paged attention's default arguments (the registry's lengths and page table) as .npy files,
/// run on the interpreter and on CPU, against the f64 reference.
#[test]
fn run_takes_paged_attention_inputs_from_npy_files() {
    let info = registry::find("paged_attention").unwrap();
    let given = [("dtype".to_string(), "f32".to_string())];
    let instance = info.instance(&given).unwrap();
    let inputs = instance.inputs(3).unwrap();
    let want = instance.reference(&inputs).unwrap();
    let d = Dir::new("paged-run");
    let names = ["q", "k_pages", "v_pages", "lengths", "page_indices"];
    let paths: Vec<String> = names
        .iter()
        .zip(&inputs[0])
        .map(|(n, a)| d.save(&format!("{n}.npy"), a))
        .collect();
    for backend in ["interpret", "cpu"] {
        let out = d.path(&format!("out-{backend}.npy"));
        let mut args = vec!["run", "paged_attention", "--backend", backend, "-o", &out];
        for p in &paths {
            args.extend(["-i", p.as_str()]);
        }
        let (ok, _, err) = tessera(&args);
        assert!(ok, "{backend}: {err}");
        let got: HostArray = read_npy(std::path::Path::new(&out)).unwrap();
        common::assert_close(&got.to_f64_vec(), &want[0][0], 1e-5, backend);
    }
}

#[test]
fn run_refuses_a_kernel_on_a_device_mesh_naming_what_runs_it() {
    let d = Dir::new("mesh-run");
    let x = d.save(
        "x.npy",
        &HostArray::random(tessera::dsl::DType::F32, [16, 128], 1),
    );
    let o = d.path("o.npy");
    let before = d.files();
    let (ok, _, err) = tessera(&["run", "all_gather", "-i", &x, "-o", &o]);
    assert!(!ok);
    assert_eq!(
        err.trim(),
        "error: `all_gather` runs on a mesh of devices, each with its own arguments, and \
         `tessera run` takes one device's .npy inputs; run it with \
         `tessera::backend::run_on_devices` from Rust (`tessera demo` checks it on 4 CPU \
         devices)"
    );
    assert_eq!(d.files(), before, "nothing written");
}

#[test]
fn ir_of_a_collective_is_on_its_mesh_and_its_stablehlo_one_partition_per_device() {
    let (ok, ir, err) = tessera(&["ir", "all_gather_matmul"]);
    assert!(ok, "{err}");
    assert!(ir.contains("context"), "{ir}");
    let (ok, hlo, err) = tessera(&["ir", "all_gather", "--emit", "stablehlo"]);
    assert!(ok, "{err}");
    assert!(hlo.contains("mhlo.num_partitions = 4"), "{hlo}");
    assert!(hlo.contains("collective_permute"), "{hlo}");
}
