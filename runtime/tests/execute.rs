//! Compile and execute hand-written StableHLO on 1 and 4 CPU devices, and the errors a user can
//! cause.

mod common;

use half::bf16;
use tessera_runtime::{
    ArrayShape, CompileOptions, ElementType, Error, HostBuffer, NamedValue, XlaOption,
};

use common::{client, iota};

fn add_program(ty: &str, n: usize) -> String {
    format!(
        r#"module @add attributes {{mhlo.num_replicas = {n} : i32, mhlo.num_partitions = 1 : i32}} {{
  func.func public @main(%a: tensor<2x3x{ty}>, %b: tensor<2x3x{ty}>) -> tensor<2x3x{ty}> {{
    %0 = stablehlo.add %a, %b : tensor<2x3x{ty}>
    return %0 : tensor<2x3x{ty}>
  }}
}}"#
    )
}

fn dot_program(ty: &str, n: usize) -> String {
    format!(
        r#"module @dot attributes {{mhlo.num_replicas = {n} : i32, mhlo.num_partitions = 1 : i32}} {{
  func.func public @main(%a: tensor<2x3x{ty}>, %b: tensor<3x4x{ty}>) -> tensor<2x4x{ty}> {{
    %0 = "stablehlo.dot_general"(%a, %b) {{dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>}} : (tensor<2x3x{ty}>, tensor<3x4x{ty}>) -> tensor<2x4x{ty}>
    return %0 : tensor<2x4x{ty}>
  }}
}}"#
    )
}

fn host_dot(a: &[f32], b: &[f32]) -> Vec<f32> {
    let mut c = vec![0.0; 8];
    for i in 0..2 {
        for j in 0..4 {
            c[i * 4 + j] = (0..3).map(|k| a[i * 3 + k] * b[k * 4 + j]).sum();
        }
    }
    c
}

#[test]
fn add_on_one_device() {
    let client = client(1);
    let exe = client
        .compile(&add_program("f32", 1), &CompileOptions::single_device())
        .unwrap();
    assert_eq!(exe.num_devices(), 1);
    assert_eq!(exe.num_outputs(), 1);
    let a = iota(6, 1.0);
    let b = iota(6, 0.5);
    let out = exe
        .execute_host(&[vec![
            HostBuffer::from_slice(&[2, 3], &a).unwrap(),
            HostBuffer::from_slice(&[2, 3], &b).unwrap(),
        ]])
        .unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0][0].dims(), &[2, 3]);
    assert_eq!(out[0][0].element_type(), ElementType::F32);
    let expected: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    assert_eq!(out[0][0].to_vec::<f32>().unwrap(), expected);
}

#[test]
fn dot_on_one_device_f32_and_bf16() {
    let client = client(1);
    let a = iota(6, 1.0);
    let b: Vec<f32> = iota(12, 0.25).into_iter().map(|x| x - 1.0).collect();
    let expected = host_dot(&a, &b);

    let exe = client
        .compile(&dot_program("f32", 1), &CompileOptions::single_device())
        .unwrap();
    let out = exe
        .execute_host(&[vec![
            HostBuffer::from_slice(&[2, 3], &a).unwrap(),
            HostBuffer::from_slice(&[3, 4], &b).unwrap(),
        ]])
        .unwrap();
    assert_eq!(out[0][0].to_vec::<f32>().unwrap(), expected);

    // Small values are exact in bf16 (8 significant bits), products and sums included.
    let exe = client
        .compile(&dot_program("bf16", 1), &CompileOptions::single_device())
        .unwrap();
    let to_bf16 = |v: &[f32]| v.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>();
    let out = exe
        .execute_host(&[vec![
            HostBuffer::from_slice(&[2, 3], &to_bf16(&a)).unwrap(),
            HostBuffer::from_slice(&[3, 4], &to_bf16(&b)).unwrap(),
        ]])
        .unwrap();
    assert_eq!(out[0][0].element_type(), ElementType::BF16);
    assert_eq!(out[0][0].to_vec::<bf16>().unwrap(), to_bf16(&expected));
}

#[test]
fn add_and_dot_on_four_devices() {
    let client = client(4);
    assert_eq!(client.devices().len(), 4);
    let options = CompileOptions::replicated(4).unwrap();

    let exe = client.compile(&add_program("f32", 4), &options).unwrap();
    assert_eq!(exe.num_devices(), 4);
    assert_eq!(exe.device_indices(), &[0, 1, 2, 3]);
    let inputs: Vec<(Vec<f32>, Vec<f32>)> = (0..4)
        .map(|d| (iota(6, d as f32 + 1.0), iota(6, -0.5)))
        .collect();
    let args: Vec<Vec<_>> = inputs
        .iter()
        .enumerate()
        .map(|(d, (a, b))| {
            vec![
                client.buffer_from_slice(a, &[2, 3], d).unwrap(),
                client.buffer_from_slice(b, &[2, 3], d).unwrap(),
            ]
        })
        .collect();
    let refs: Vec<Vec<_>> = args.iter().map(|l| l.iter().collect()).collect();
    let out = exe.execute(&refs).unwrap();
    assert_eq!(out.len(), 4);
    for (d, ((a, b), outputs)) in inputs.iter().zip(&out).enumerate() {
        assert_eq!(outputs[0].device_index(), d);
        let expected: Vec<f32> = a.iter().zip(b).map(|(x, y)| x + y).collect();
        assert_eq!(outputs[0].to_vec::<f32>().unwrap(), expected, "device {d}");
    }
    // Arguments are not donated: still readable after execution.
    assert_eq!(args[2][0].to_vec::<f32>().unwrap(), inputs[2].0);

    let exe = client.compile(&dot_program("f32", 4), &options).unwrap();
    let lists: Vec<Vec<HostBuffer>> = (0..4)
        .map(|d| {
            vec![
                HostBuffer::from_slice(&[2, 3], &iota(6, d as f32)).unwrap(),
                HostBuffer::from_slice(&[3, 4], &iota(12, 0.5)).unwrap(),
            ]
        })
        .collect();
    let out = exe.execute_host(&lists).unwrap();
    for (d, outputs) in out.iter().enumerate() {
        let expected = host_dot(&iota(6, d as f32), &iota(12, 0.5));
        assert_eq!(outputs[0].to_vec::<f32>().unwrap(), expected, "device {d}");
    }
}

#[test]
fn integer_and_pred_buffers() {
    let client = client(1);
    let program = r#"
func.func public @main(%a: tensor<4xi32>, %b: tensor<4xi8>, %p: tensor<4xi1>) -> (tensor<4xi32>, tensor<4xi8>, tensor<4xi1>, tensor<4xi1>) {
  %0 = stablehlo.multiply %a, %a : tensor<4xi32>
  %1 = stablehlo.negate %b : tensor<4xi8>
  %2 = stablehlo.not %p : tensor<4xi1>
  %3 = stablehlo.compare GT, %a, %0 : (tensor<4xi32>, tensor<4xi32>) -> tensor<4xi1>
  return %0, %1, %2, %3 : tensor<4xi32>, tensor<4xi8>, tensor<4xi1>, tensor<4xi1>
}"#;
    let exe = client.compile(program, &CompileOptions::default()).unwrap();
    assert_eq!(exe.num_outputs(), 4);
    let a = [-3i32, 0, 1, 46341];
    let b = [1i8, -2, 127, -128];
    let p = [true, false, false, true];
    let out = exe
        .execute_host(&[vec![
            HostBuffer::from_slice(&[4], &a).unwrap(),
            HostBuffer::from_slice(&[4], &b).unwrap(),
            HostBuffer::from_slice(&[4], &p).unwrap(),
        ]])
        .unwrap();
    let out = &out[0];
    assert_eq!(
        out[0].to_vec::<i32>().unwrap(),
        a.map(|x| x.wrapping_mul(x)).to_vec()
    );
    assert_eq!(
        out[1].to_vec::<i8>().unwrap(),
        b.map(i8::wrapping_neg).to_vec()
    );
    assert_eq!(out[2].element_type(), ElementType::Pred);
    assert_eq!(out[2].to_vec::<bool>().unwrap(), p.map(|x| !x).to_vec());
    assert_eq!(
        out[3].to_vec::<bool>().unwrap(),
        a.map(|x| x > x.wrapping_mul(x)).to_vec()
    );
}

#[test]
fn invalid_program_reports_the_compiler_message() {
    let client = client(1);
    let program = r#"
func.func public @main(%a: tensor<2xf32>) -> tensor<3xf32> {
  %0 = stablehlo.add %a, %a : tensor<2xf32>
  return %0 : tensor<2xf32>
}"#;
    let err = client
        .compile(program, &CompileOptions::default())
        .unwrap_err();
    match &err {
        Error::Pjrt {
            operation,
            code,
            message,
        } => {
            assert_eq!(*operation, "PJRT_Client_Compile");
            // The MLIR verifier's own words reach the caller.
            assert!(
                message.contains("doesn't match function result type"),
                "compiler message: {message}"
            );
            let _ = code;
        }
        other => panic!("expected a PJRT error, got {other:?}"),
    }
    assert!(err.to_string().contains("PJRT_Client_Compile"));

    let err = client
        .compile("this is not MLIR", &CompileOptions::default())
        .unwrap_err();
    assert!(matches!(err, Error::Pjrt { .. }), "{err}");
}

#[test]
fn xla_options_reach_the_compiler() {
    let client = client(1);
    // A real option changes nothing a program computes.
    let options = CompileOptions::single_device()
        .with_xla_option("xla_cpu_use_xnnpack", XlaOption::Bool(false))
        .with_xla_option("xla_cpu_parallel_codegen_split_count", XlaOption::Int(4));
    let exe = client.compile(&dot_program("f32", 1), &options).unwrap();
    let (a, b) = (iota(6, 1.0), iota(12, -2.0));
    let out = exe
        .execute_host(&[vec![
            HostBuffer::from_slice(&[2, 3], &a).unwrap(),
            HostBuffer::from_slice(&[3, 4], &b).unwrap(),
        ]])
        .unwrap();
    assert_eq!(out[0][0].to_vec::<f32>().unwrap(), host_dot(&a, &b));
    // An unknown one fails the compile, naming it: the options are not silently dropped.
    let bogus = CompileOptions::single_device()
        .with_xla_option("xla_no_such_option", XlaOption::Str("x".into()));
    let err = client.compile(&dot_program("f32", 1), &bogus).unwrap_err();
    assert!(err.to_string().contains("xla_no_such_option"), "{err}");
}

#[test]
fn device_count_mismatch() {
    // Execute with fewer argument lists than devices.
    let client = client(4);
    let exe = client
        .compile(
            &add_program("f32", 4),
            &CompileOptions::replicated(4).unwrap(),
        )
        .unwrap();
    let lists: Vec<Vec<HostBuffer>> = (0..3)
        .map(|_| vec![HostBuffer::from_slice(&[2, 3], &[0f32; 6]).unwrap(); 2])
        .collect();
    let err = exe.execute_host(&lists).unwrap_err();
    assert!(
        matches!(
            err,
            Error::DeviceCountMismatch {
                expected: 4,
                actual: 3
            }
        ),
        "{err}"
    );
    let none: [Vec<&tessera_runtime::Buffer>; 0] = [];
    assert!(matches!(
        exe.execute(&none),
        Err(Error::DeviceCountMismatch { .. })
    ));

    // Compile for 4 devices on a 1-device client: the plugin refuses.
    let one = common::client(1);
    let err = one
        .compile(
            &add_program("f32", 4),
            &CompileOptions::replicated(4).unwrap(),
        )
        .unwrap_err();
    assert!(matches!(err, Error::Pjrt { .. }), "{err}");
}

#[test]
fn argument_errors_are_results() {
    let client = client(4);
    let exe = client
        .compile(
            &add_program("f32", 4),
            &CompileOptions::replicated(4).unwrap(),
        )
        .unwrap();

    // Host data that does not fill its shape.
    let err = HostBuffer::from_slice(&[2, 3], &[1f32; 5]).unwrap_err();
    assert!(matches!(
        err,
        Error::BufferSize {
            expected_bytes: 24,
            actual_bytes: 20,
            ..
        }
    ));
    assert!(matches!(
        client.buffer_from_slice(&[1f32; 7], &[2, 3], 0),
        Err(Error::BufferSize { .. })
    ));

    // A device index out of range.
    assert!(matches!(
        client.buffer_from_slice(&[1f32; 6], &[2, 3], 4),
        Err(Error::DeviceIndex {
            index: 4,
            device_count: 4
        })
    ));

    // Buffers of the wrong shape or type for the program are caught before the plugin sees
    // them (newer plugins crash on a mismatch in a multi-device execute).
    let expected = ArrayShape {
        element_type: ElementType::F32,
        dims: vec![2, 3],
    };
    assert_eq!(exe.parameters(), Some(&[expected.clone(), expected][..]));
    let good: Vec<_> = (0..4)
        .map(|d| client.buffer_from_slice(&[1f32; 6], &[2, 3], d).unwrap())
        .collect();
    let wrong_shape = client.buffer_from_slice(&[1f32; 4], &[4], 0).unwrap();
    let wrong_type = client.buffer_from_slice(&[1i32; 6], &[2, 3], 2).unwrap();
    let mut lists: Vec<Vec<_>> = good.iter().map(|b| vec![b, b]).collect();
    lists[0][1] = &wrong_shape;
    let err = exe.execute(&lists).unwrap_err();
    assert!(
        matches!(
            err,
            Error::ArgumentShape {
                list: 0,
                argument: 1,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("tensor<4xf32>"), "{err}");
    let mut lists: Vec<Vec<_>> = good.iter().map(|b| vec![b, b]).collect();
    lists[2][0] = &wrong_type;
    let err = exe.execute(&lists).unwrap_err();
    assert!(
        matches!(
            err,
            Error::ArgumentShape {
                list: 2,
                argument: 0,
                ..
            }
        ),
        "{err}"
    );
    let lists: Vec<Vec<_>> = good.iter().map(|b| vec![b, b, b]).collect();
    assert!(matches!(
        exe.execute(&lists),
        Err(Error::ParameterCount {
            expected: 2,
            actual: 3
        })
    ));

    // A buffer on the wrong device.
    let mut lists: Vec<Vec<_>> = good.iter().map(|b| vec![b, b]).collect();
    lists[1][0] = &good[0];
    let err = exe.execute(&lists).unwrap_err();
    assert!(
        matches!(
            err,
            Error::WrongDevice {
                list: 1,
                argument: 0,
                expected_device: 1,
                actual_device: 0
            }
        ),
        "{err}"
    );

    // Lists of different lengths.
    let mut lists: Vec<Vec<_>> = good.iter().map(|b| vec![b, b]).collect();
    lists[3].pop();
    assert!(matches!(
        exe.execute(&lists),
        Err(Error::ArgumentCount {
            device: 3,
            expected: 2,
            actual: 1
        })
    ));

    // A buffer of another client.
    let other = tessera_runtime::Client::cpu(4).unwrap();
    let foreign = other.buffer_from_slice(&[1f32; 6], &[2, 3], 0).unwrap();
    let mut lists: Vec<Vec<_>> = good.iter().map(|b| vec![b, b]).collect();
    lists[0][0] = &foreign;
    assert!(matches!(
        exe.execute(&lists),
        Err(Error::ForeignObject { .. })
    ));

    // Reading back as the wrong type.
    let b = client.buffer_from_slice(&[1i32; 2], &[2], 0).unwrap();
    assert!(matches!(
        b.to_vec::<f32>(),
        Err(Error::ElementTypeMismatch { .. })
    ));

    // Invalid compile options and client sizes.
    assert!(matches!(
        CompileOptions::replicated(0),
        Err(Error::InvalidCompileOptions(_))
    ));
    let mut bad = CompileOptions::manual_partitions(4).unwrap();
    bad.num_partitions = 3;
    assert!(matches!(
        client.compile(&add_program("f32", 1), &bad),
        Err(Error::InvalidCompileOptions(_))
    ));
    assert!(matches!(
        client.plugin().cpu_client(0),
        Err(Error::InvalidDeviceCount { requested: 0 })
    ));
}

#[test]
fn client_reports_devices_and_plugin() {
    let client = client(4);
    assert_eq!(client.platform_name(), "cpu");
    let ids: Vec<i32> = client.devices().iter().map(|d| d.id()).collect();
    assert_eq!(ids, vec![0, 1, 2, 3]);
    for (i, d) in client.devices().iter().enumerate() {
        assert_eq!(d.index(), i);
        assert!(!d.kind().is_empty());
    }
    let plugin = client.plugin();
    let (major, minor) = plugin.api_version();
    assert_eq!(major, 0);
    assert!(minor >= 81, "{minor}");
    assert!(
        plugin.attribute("stablehlo_current_version").is_some(),
        "{:?}",
        plugin.attributes()
    );
    // The shared client is cached per device count.
    let again = common::client(4);
    assert!(std::ptr::eq(again.devices(), client.devices()));
    // Loading the same plugin twice yields the same plugin.
    let reloaded = tessera_runtime::Plugin::load(plugin.path()).unwrap();
    assert_eq!(reloaded.path(), plugin.path());
}

#[test]
fn concurrent_execution_from_threads() {
    let client = client(2);
    let exe = client
        .compile(&add_program("f32", 1), &CompileOptions::single_device())
        .unwrap();
    std::thread::scope(|s| {
        for t in 0..4 {
            let (client, exe) = (&client, &exe);
            s.spawn(move || {
                for i in 0..8 {
                    let a = client
                        .buffer_from_slice(&iota(6, t as f32), &[2, 3], 0)
                        .unwrap();
                    let b = client
                        .buffer_from_slice(&iota(6, i as f32), &[2, 3], 0)
                        .unwrap();
                    let out = exe.execute(&[[&a, &b]]).unwrap();
                    let expected: Vec<f32> = (0..6).map(|k| (k * (t + i)) as f32).collect();
                    assert_eq!(out[0][0].to_vec::<f32>().unwrap(), expected);
                }
            });
        }
    });
    // Buffers and executables move between threads.
    let buffer = client.buffer_from_slice(&[1.0f32, 2.0], &[2], 1).unwrap();
    let back = std::thread::spawn(move || buffer.to_vec::<f32>().unwrap())
        .join()
        .unwrap();
    assert_eq!(back, vec![1.0, 2.0]);
}

#[test]
fn compiled_executables_report_memory_costs_and_their_program() {
    let client = client(1);
    let exe = client
        .compile(&dot_program("f32", 1), &CompileOptions::single_device())
        .unwrap();
    let compiled = exe.executable().unwrap();
    let stats = compiled
        .memory_stats()
        .unwrap()
        .expect("the CPU plugin reports memory");
    assert_eq!(stats.argument_bytes, (6 + 12) * 4);
    assert_eq!(stats.output_bytes, 8 * 4);
    // The query works on every plugin; what it holds depends on the plugin: xla-cpu-pjrt
    // 0.0.1 reports XLA's cost analysis, lammps-jax-pjrt-cpu 0.11.2 (the default) an empty
    // list. libtpu's is checked in tests/topology.rs.
    let costs = compiled.cost_analysis().unwrap();
    if !costs.is_empty() {
        let flops = costs.iter().find(|(n, _)| n == "flops").map(|(_, v)| v);
        // 2x3 @ 3x4: 3 multiply-adds per output element, 8 elements.
        assert!(
            matches!(flops, Some(NamedValue::Float(f)) if *f == 48.0),
            "{costs:?}"
        );
    }
    println!("code {:?}", compiled.generated_code_size().unwrap());
    let program = compiled
        .optimized_program()
        .unwrap()
        .expect("XLA returns its HLO");
    assert!(program.format.starts_with("hlo"), "{}", program.format);
    assert!(!program.code.is_empty());
}
