//! `tessera compile` misused as a new user would (issue 23): topologies outside their chip
//! family, VMEM limits above the chip's (including ones that overflow), outputs that alias or
//! cannot be written, no subcommand. Each gets one sentence (at most 6 lines), an exit status
//! below 124, no panic, and leaves nothing behind; emitted files appear whole when the
//! compile succeeds.

mod common;

use std::process::{Command, Output};

use common::{assert_refused, Dir};

fn compile(dir: &Dir, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tessera"))
        .current_dir(&dir.0)
        .arg("compile")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn misuses_of_compile_are_refused_and_leave_nothing() {
    let d = Dir::new("compile-errors");
    let cases: &[(&[&str], &str)] = &[
        (
            &["--target", "tpu:v5p:1024x1024x1024", "kernel", "matmul"],
            "v5p:1024x1024x1024 is not a slice of v5p: v5p slices are 3-D tori of at most \
             6144 chips, each dim at most 24",
        ),
        (
            &["--target", "tpu:v5e:2x2x2", "kernel", "matmul"],
            "v5e:2x2x2 is not a slice of v5e: v5e slices are 2-D tori of at most 256 chips",
        ),
        (
            &[
                "--target",
                "tpu:v4:99999999999999999999x1x1",
                "kernel",
                "matmul",
            ],
            "unknown target `tpu:v4:99999999999999999999x1x1`",
        ),
        (
            &["--target", "tpu:v9z:1", "kernel", "matmul"],
            "`v9z` is not a TPU chip family tessera compiles for",
        ),
        (
            &["--vmem-limit-mib", "1048576", "kernel", "matmul"],
            "--vmem-limit-mib 1048576 is more than the 64 MiB of VMEM a v5p TensorCore has",
        ),
        (
            &[
                "--vmem-limit-mib",
                "18446744073709551615",
                "--target",
                "tpu:v5e:2x2",
                "kernel",
                "matmul",
            ],
            "--vmem-limit-mib 18446744073709551615 is more than the 128 MiB of VMEM a v5e \
             TensorCore has; give at most 128",
        ),
        (
            &["--vmem-limit-mib", "0", "kernel", "matmul"],
            "--vmem-limit-mib must be at least 1",
        ),
        (
            &[
                "--emit-mosaic",
                "D",
                "--emit-stablehlo",
                "D",
                "kernel",
                "matmul",
            ],
            "--emit-mosaic D and --emit-stablehlo D name the same path",
        ),
        (
            &["--emit-mosaic", "missing/D", "kernel", "matmul"],
            "--emit-mosaic missing/D: the directory missing does not exist",
        ),
        (
            &["--emit-stablehlo", "/dev/null", "kernel", "matmul"],
            "--emit-stablehlo /dev/null is not a regular file",
        ),
        (
            &[
                "--emit-mosaic",
                "D",
                "--emit-stablehlo",
                "p.mlir",
                "kernel",
                "nope",
            ],
            "unknown kernel `nope`",
        ),
        (
            &[
                "--emit-mosaic",
                "D",
                "train",
                "--per-device-batch-size",
                "100000000",
            ],
            "but one v5p chip's HBM has 95.9 GiB",
        ),
        (&[], "`tessera compile` needs a subcommand"),
    ];
    for (args, want) in cases {
        let out = compile(&d, args);
        assert_refused(&format!("{args:?}"), &out, want);
        assert!(d.files().is_empty(), "{args:?} left {:?}", d.files());
    }
    // No subcommand: the sentence and one line per subcommand.
    let stderr = String::from_utf8_lossy(&compile(&d, &[]).stderr).into_owned();
    let names: Vec<&str> = stderr
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(names, ["attention", "train", "kernel"], "{stderr}");
}

#[test]
fn emitted_files_appear_whole_when_the_compile_succeeds() {
    let d = Dir::new("compile-emits");
    let out = compile(
        &d,
        &[
            "--emit-mosaic",
            "mosaic",
            "--emit-stablehlo",
            "program.mlir",
            "kernel",
            "matmul",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(d.files(), ["mosaic", "program.mlir"]);
    let kernels: Vec<String> = std::fs::read_dir(d.0.join("mosaic"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(kernels, ["matmul.mlir"]);
    let text = std::fs::read_to_string(d.0.join("mosaic/matmul.mlir")).unwrap();
    assert!(text.contains("func.func"), "{text}");
    let program = std::fs::read_to_string(d.0.join("program.mlir")).unwrap();
    assert!(program.contains("tpu_custom_call"), "{program}");
    // Again into the existing directory: its files are replaced, nothing else appears.
    let out = compile(&d, &["--emit-mosaic", "mosaic", "kernel", "matmul"]);
    assert!(out.status.success());
    assert_eq!(d.files(), ["mosaic", "program.mlir"]);
    assert_eq!(std::fs::read_dir(d.0.join("mosaic")).unwrap().count(), 1);
}

/// `tessera tune` checks its block bounds and VMEM budget before compiling anything, as
/// `tessera compile` checks its budget.
#[test]
fn misuses_of_tune_are_refused_before_compiling() {
    let d = Dir::new("tune-errors");
    let cases: &[(&[&str], &str)] = &[
        (
            &["--min-block", "3", "attention"],
            "--min-block 3 is not a power of two; the search tries powers of two (e.g. \
             --min-block 4)",
        ),
        (
            &["--max-block", "1000", "kernel", "matmul"],
            "--max-block 1000 is not a power of two",
        ),
        (
            &["--min-block", "4096", "attention"],
            "--min-block 4096 is above --max-block 2048",
        ),
        (
            &["--vmem-limit-kib", "1073741824", "attention"],
            "--vmem-limit-kib 1073741824 is more than the 64 MiB of VMEM a v5p TensorCore has; \
             give at most 65536",
        ),
    ];
    for (args, want) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
            .current_dir(&d.0)
            .args(["tune", "--target", "tpu:v5p:2x2x1"])
            .args(*args)
            .output()
            .unwrap();
        assert_refused(&format!("tune {args:?}"), &out, want);
        assert!(d.files().is_empty(), "{args:?} left {:?}", d.files());
    }
}
