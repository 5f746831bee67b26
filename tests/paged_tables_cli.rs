//! `tessera run paged_attention` checks the page table and lengths before any backend: a page
//! index outside the pool or a length outside the table is refused on the interpreter and on
//! CPU (before the kernel's own run-time checks, in the table's terms) with one line naming the
//! sequence, the entry and the bound, exit 1, and no output file; padding past a length and
//! pages shared between sequences run to the reference.

mod common;

use std::path::Path;
use std::process::Command;

use tessera::dsl::HostArray;
use tessera::npy::read_npy;
use tessera::registry;

use common::{assert_one_line_error, assert_refused, with_i32, Dir};

/// The registry's paged attention inputs at its defaults (f32; B 4, a pool of 64 pages of 16
/// tokens, 8 entries per sequence: lengths 128, 93, 64 and 29 use 8, 6, 4 and 2 entries).
fn default_inputs() -> Vec<HostArray> {
    let instance = registry::find("paged_attention")
        .unwrap()
        .instance(&[])
        .unwrap();
    instance.inputs(1).unwrap().remove(0)
}

/// Saves `args` as `NAME-<tag>.npy`; the `tessera run` arguments for them on `backend`,
/// writing `out`.
fn run_args(d: &Dir, tag: &str, args: &[HostArray], backend: &str, out: &str) -> Vec<String> {
    let names = ["q", "k_pages", "v_pages", "lengths", "page_indices"];
    let mut cmd: Vec<String> = ["run", "paged_attention", "--backend", backend, "-o", out]
        .map(String::from)
        .to_vec();
    for (n, a) in names.iter().zip(args) {
        cmd.push("-i".into());
        cmd.push(d.save(&format!("{n}-{tag}.npy"), a));
    }
    cmd
}

#[test]
fn run_refuses_a_page_outside_the_pool_and_a_length_past_the_table() {
    let args = default_inputs();
    let d = Dir::new("paged-tables");
    let mut cases = Vec::new();
    for page in [64, 100, -1, i32::MIN, i32::MAX] {
        cases.push((
            format!("page{page}"),
            with_i32(&args, 4, 2 * 8 + 3, page),
            format!(
                "error: paged attention: sequence 2 reads entry page_indices[2, 3] = {page}, \
                 which is no page of the pool's 64 (0 to 63); its 64 tokens use entries 0 to 3"
            ),
        ));
    }
    for length in [129, -1, i32::MIN, i32::MAX] {
        cases.push((
            format!("length{length}"),
            with_i32(&args, 3, 1, length),
            format!(
                "error: paged attention: sequence 1 has length lengths[1] = {length}, outside \
                 0 to 128 (its table row holds 8 pages of 16 tokens)"
            ),
        ));
    }
    for (tag, bad, sentence) in cases {
        for backend in ["interpret", "cpu"] {
            let out = d.path(&format!("out-{tag}-{backend}.npy"));
            let cmd = run_args(&d, &tag, &bad, backend, &out);
            let before = d.files();
            let result = Command::new(env!("CARGO_BIN_EXE_tessera"))
                .args(&cmd)
                .output()
                .unwrap();
            assert_one_line_error(&cmd, &result, &sentence);
            assert_refused(&tag, &result, &sentence);
            assert_eq!(result.status.code(), Some(1), "{tag} {backend}");
            assert_eq!(
                String::from_utf8_lossy(&result.stderr).trim(),
                sentence,
                "{tag} {backend}"
            );
            assert_eq!(d.files(), before, "{tag} {backend}: files written");
        }
    }
}

#[test]
fn run_takes_padding_past_a_length_and_shared_pages() {
    let mut args = default_inputs();
    let mut table: Vec<i32> = args[4].to_f64_vec().iter().map(|&x| x as i32).collect();
    // Sequence 2's entries 4.. and sequence 3's 2.. are unused: any value.
    for (i, entry) in table[2 * 8 + 4..2 * 8 + 8].iter_mut().enumerate() {
        *entry = [-1, 64, i32::MIN, i32::MAX][i];
    }
    for entry in &mut table[3 * 8 + 2..] {
        *entry = 100;
    }
    // Sequence 3 reads sequence 0's first two pages.
    table[3 * 8] = table[0];
    table[3 * 8 + 1] = table[1];
    args[4] = HostArray::i32([4, 8], table).unwrap();
    let instance = registry::find("paged_attention")
        .unwrap()
        .instance(&[])
        .unwrap();
    let want = instance.reference(std::slice::from_ref(&args)).unwrap();
    let d = Dir::new("paged-padding");
    for backend in ["interpret", "cpu"] {
        let out = d.path(&format!("out-{backend}.npy"));
        let cmd = run_args(&d, backend, &args, backend, &out);
        let result = Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(&cmd)
            .output()
            .unwrap();
        assert!(
            result.status.success(),
            "{backend}: {}",
            String::from_utf8_lossy(&result.stderr)
        );
        let got: HostArray = read_npy(Path::new(&out)).unwrap();
        common::assert_close(&got.to_f64_vec(), &want[0][0], 1e-5, backend);
    }
}
