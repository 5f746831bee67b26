//! Checks the hand-written binding (`tessera_runtime::ffi`) against the real `pjrt_c_api.h`:
//! a C program compiled with the system `cc` prints `sizeof`, `_Alignof`, `<name>_STRUCT_SIZE`
//! and every field offset of every bound struct (including every function-pointer slot of
//! `PJRT_Api`), and the value of every bound enum constant; the test compares them with Rust's
//! `size_of`/`align_of`/`offset_of!`.
//!
//! The header comes from `TESSERA_PJRT_HEADER` if set, else from the provisioned
//! `xla-cpu-pjrt==0.0.1` wheel (the one the binding was written from).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

use tessera_runtime::ffi::{ENUM_VALUES, STRUCT_LAYOUTS};
use tessera_runtime::provision::provision_wheel;
use tessera_runtime::WheelSpec;

fn header() -> PathBuf {
    if let Some(h) = std::env::var_os("TESSERA_PJRT_HEADER").filter(|v| !v.is_empty()) {
        return PathBuf::from(h);
    }
    provision_wheel(&WheelSpec::xla_cpu_pjrt())
        .expect("provisioning xla-cpu-pjrt==0.0.1 for its header")
        .header
        .expect("the xla-cpu-pjrt wheel ships include/pjrt_c_api.h")
}

#[test]
fn binding_matches_the_c_header() {
    let header = header();
    let mut c = String::new();
    writeln!(
        c,
        "#include <stdio.h>\n#include <stddef.h>\n#include \"{}\"",
        header.display()
    )
    .unwrap();
    c.push_str("int main(void) {\n");
    let mut expected = BTreeMap::new();
    for s in STRUCT_LAYOUTS {
        let n = s.name;
        writeln!(c, "  printf(\"size {n} %zu\\n\", sizeof({n}));").unwrap();
        writeln!(c, "  printf(\"align {n} %zu\\n\", _Alignof({n}));").unwrap();
        writeln!(
            c,
            "  printf(\"struct_size {n} %zu\\n\", (size_t){n}_STRUCT_SIZE);"
        )
        .unwrap();
        expected.insert(format!("size {n}"), s.size as i64);
        expected.insert(format!("align {n}"), s.align as i64);
        expected.insert(format!("struct_size {n}"), s.struct_size as i64);
        for (field, offset) in s.fields {
            writeln!(
                c,
                "  printf(\"offset {n}.{field} %zu\\n\", offsetof({n}, {field}));"
            )
            .unwrap();
            expected.insert(format!("offset {n}.{field}"), *offset as i64);
        }
    }
    for (name, value) in ENUM_VALUES {
        writeln!(
            c,
            "  printf(\"value {name} %lld\\n\", (long long)({name}));"
        )
        .unwrap();
        expected.insert(format!("value {name}"), *value);
    }
    c.push_str("  return 0;\n}\n");

    let dir = std::env::temp_dir().join(format!("tessera-ffi-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, &c).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .expect("running the C compiler (`cc`, or $CC)");
    assert!(status.success(), "compiling {} failed", src.display());
    let out = Command::new(&exe).output().unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    let actual: BTreeMap<String, i64> = stdout
        .lines()
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect();
    let _ = std::fs::remove_dir_all(&dir);

    let mismatches: Vec<String> = expected
        .iter()
        .filter(|(k, v)| actual.get(*k) != Some(v))
        .map(|(k, v)| format!("{k}: rust {v}, C {:?}", actual.get(k)))
        .collect();
    assert!(
        mismatches.is_empty(),
        "binding differs from the header:\n{}",
        mismatches.join("\n")
    );
    // Sanity: the whole PJRT_Api table was compared (every slot, bound or not).
    let api = STRUCT_LAYOUTS
        .iter()
        .find(|s| s.name == "PJRT_Api")
        .unwrap();
    assert!(
        api.fields.len() > 120,
        "{} PJRT_Api fields",
        api.fields.len()
    );
    println!(
        "checked {} values against {}",
        expected.len(),
        header.display()
    );
}
