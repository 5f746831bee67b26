//! `TESSERA_PJRT_PLUGIN` naming a missing file, a directory or a device is an error that names
//! the path, the variable and what is wrong. Its own test binary: it sets process environment.

use tessera_runtime::{cpu_plugin_path, libtpu_path, Client, Error, Plugin};

#[test]
fn missing_override_names_path_and_variable() {
    let missing = std::env::temp_dir().join("tessera-no-such-plugin/libnothing.so");
    std::env::set_var("TESSERA_PJRT_PLUGIN", &missing);
    let err = cpu_plugin_path().unwrap_err();
    assert!(matches!(err, Error::PluginOverrideMissing { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("TESSERA_PJRT_PLUGIN"), "{text}");
    assert!(text.contains(&*missing.to_string_lossy()), "{text}");
    assert!(text.contains("does not exist"), "{text}");
    // A directory or a device is named as what it is.
    for (path, problem) in [
        (std::env::temp_dir(), "is a directory"),
        ("/dev/null".into(), "is not a regular file"),
    ] {
        std::env::set_var("TESSERA_PJRT_PLUGIN", &path);
        let text = cpu_plugin_path().unwrap_err().to_string();
        assert!(text.contains(problem), "{text}");
        assert!(text.contains("point it at the plugin's .so file"), "{text}");
    }
    std::env::set_var("TESSERA_PJRT_PLUGIN", &missing);
    // Everything built on it reports the same error instead of provisioning.
    assert!(matches!(
        Client::cpu_shared(1),
        Err(Error::PluginOverrideMissing { .. })
    ));

    // An invalid wheel spec is reported too.
    std::env::remove_var("TESSERA_PJRT_PLUGIN");
    std::env::set_var("TESSERA_CPU_PLUGIN_WHEEL", "xla-cpu-pjrt>=0.0.1");
    assert!(matches!(
        cpu_plugin_path(),
        Err(Error::InvalidWheelSpec { .. })
    ));
    std::env::remove_var("TESSERA_CPU_PLUGIN_WHEEL");

    // Loading something that is not a PJRT plugin is an error, not a crash.
    let not_a_plugin =
        std::env::temp_dir().join(format!("tessera-not-a-plugin-{}.so", std::process::id()));
    std::fs::write(&not_a_plugin, b"garbage").unwrap();
    let err = Plugin::load(&not_a_plugin).unwrap_err();
    assert!(matches!(err, Error::Load { .. }), "{err}");
    let _ = std::fs::remove_file(&not_a_plugin);
    let err = Plugin::load("/nonexistent/plugin.so").unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
    // The OS error is in the message once, and not again as a source (which a chain printer
    // such as anyhow's `{:#}` would append).
    assert!(err.to_string().contains("No such file"), "{err}");
    assert!(std::error::Error::source(&err).is_none(), "{err}");
}

#[test]
fn tpu_compiler_override_and_environment() {
    // One test owns the libtpu variables of this process (tests run in threads).
    let missing = std::env::temp_dir().join("tessera-no-such-libtpu/libtpu.so");
    std::env::set_var("TESSERA_LIBTPU", &missing);
    let err = Plugin::libtpu().unwrap_err();
    assert!(matches!(err, Error::PluginOverrideMissing { .. }), "{err}");
    assert!(err.to_string().contains("TESSERA_LIBTPU"), "{err}");
    std::env::remove_var("TESSERA_LIBTPU");
    std::env::set_var("TESSERA_LIBTPU_WHEEL", "libtpu");
    assert!(matches!(libtpu_path(), Err(Error::InvalidWheelSpec { .. })));
    std::env::remove_var("TESSERA_LIBTPU_WHEEL");

    // Without the compile-only environment libtpu is not loaded, and the error says how.
    let existing = std::env::current_exe().unwrap();
    std::env::set_var("TESSERA_LIBTPU", &existing);
    std::env::remove_var("TPU_SKIP_MDS_QUERY");
    let err = Plugin::libtpu().unwrap_err();
    assert!(
        matches!(
            err,
            Error::LibtpuEnvironment {
                variable: "TPU_SKIP_MDS_QUERY",
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("set_libtpu_compile_only_env"),
        "{err}"
    );
    tessera_runtime::provision::set_libtpu_compile_only_env();
    assert_eq!(std::env::var("TPU_SKIP_MDS_QUERY").unwrap(), "1");
    std::env::remove_var("TESSERA_LIBTPU");
}
