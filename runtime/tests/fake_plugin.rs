//! Plugin loading errors, with tiny fake "plugins" built by the system C compiler: a library
//! without `GetPjrtApi`, one of another major C API version, one whose entry point returns null,
//! and one whose function table is too short for `PJRT_Plugin_Initialize` (the table-length
//! check that makes older plugins safe).

use std::path::{Path, PathBuf};
use std::process::Command;

use tessera_runtime::{Error, Plugin};

const TABLE: &str = r#"
#include <stddef.h>
struct version { size_t struct_size; void* ext; int major; int minor; };
struct api { size_t struct_size; void* ext; struct version v; void* fns[3]; };
"#;

fn build(dir: &Path, name: &str, body: &str) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    let lib = dir.join(format!("lib{name}.so"));
    std::fs::write(&src, format!("{TABLE}\n{body}\n")).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(cc)
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .expect("running the C compiler (`cc`, or $CC)");
    assert!(status.success());
    lib
}

#[test]
fn loading_errors_are_results() {
    let dir = std::env::temp_dir().join(format!("tessera-fake-plugins-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    let none = build(&dir, "nosymbol", "int something(void) { return 0; }");
    let err = Plugin::load(&none).unwrap_err();
    assert!(matches!(err, Error::NotAPlugin { .. }), "{err}");
    assert!(err.to_string().contains("GetPjrtApi"), "{err}");

    let null = build(&dir, "null", "const void* GetPjrtApi(void) { return 0; }");
    let err = Plugin::load(&null).unwrap_err();
    assert!(matches!(err, Error::NotAPlugin { .. }), "{err}");

    let major = build(
        &dir,
        "major",
        "static struct api a = { sizeof(struct api), 0, { sizeof(struct version), 0, 1, 3 }, {0} };
         const struct api* GetPjrtApi(void) { return &a; }",
    );
    let err = Plugin::load(&major).unwrap_err();
    assert!(
        matches!(
            err,
            Error::VersionMismatch {
                plugin_major: 1,
                plugin_minor: 3,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("1.3") && err.to_string().contains("0.81"),
        "{err}"
    );

    // The table ends right before PJRT_Plugin_Initialize: the slot must not be read.
    let short = build(
        &dir,
        "short",
        "static struct api a = { sizeof(struct api), 0, { sizeof(struct version), 0, 0, 1 }, {0} };
         const struct api* GetPjrtApi(void) { return &a; }",
    );
    let err = Plugin::load(&short).unwrap_err();
    assert!(
        matches!(
            err,
            Error::MissingFunction {
                function: "PJRT_Plugin_Initialize",
                ..
            }
        ),
        "{err}"
    );

    let _ = std::fs::remove_dir_all(&dir);
}
