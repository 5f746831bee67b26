//! Device-resident execution: outputs fed back as inputs, donated arguments, and what the XLA
//! CPU plugin does with a donation (measured, not assumed).

mod common;

use tessera_runtime::{Argument, CompileOptions, Error, HostBuffer};

use common::client;

/// `state + delta`, with `state` aliased to the result when `alias` (JAX's donation form).
fn step_program(n: usize, alias: bool) -> String {
    let attr = if alias {
        " {tf.aliasing_output = 0 : i32}"
    } else {
        ""
    };
    format!(
        r#"module @step attributes {{mhlo.num_replicas = {n} : i32, mhlo.num_partitions = 1 : i32}} {{
  func.func public @main(%state: tensor<1024xf32>{attr}, %delta: tensor<1024xf32>) -> tensor<1024xf32> {{
    %0 = stablehlo.add %state, %delta : tensor<1024xf32>
    return %0 : tensor<1024xf32>
  }}
}}"#
    )
}

fn host(value: f32) -> HostBuffer {
    HostBuffer::from_slice(&[1024], &vec![value; 1024]).unwrap()
}

#[test]
fn donated_state_is_reused_in_place_and_stays_on_the_device() {
    let client = client(1);
    let exe = client
        .compile(&step_program(1, true), &CompileOptions::single_device())
        .unwrap();
    let delta = client.buffer_from_host(&host(0.5), 0).unwrap();
    let mut state = client.buffer_from_host(&host(1.0), 0).unwrap();
    for step in 1..=10 {
        let before = state.device_address().unwrap();
        let mut out = exe
            .execute_donating(vec![vec![Argument::Donated(state), Argument::Lent(&delta)]])
            .unwrap();
        state = out[0].pop().unwrap();
        // The plugin wrote the result into the donated input's memory.
        assert_eq!(state.device_address().unwrap(), before, "step {step}");
        assert!(!state.is_deleted().unwrap());
    }
    // The lent argument is untouched and still usable.
    assert_eq!(delta.to_vec::<f32>().unwrap(), vec![0.5; 1024]);
    assert_eq!(state.to_vec::<f32>().unwrap(), vec![6.0; 1024]);
}

#[test]
fn lent_state_of_an_aliasing_program_stays_valid() {
    let client = client(1);
    let exe = client
        .compile(&step_program(1, true), &CompileOptions::single_device())
        .unwrap();
    let state = client.buffer_from_host(&host(1.0), 0).unwrap();
    let delta = client.buffer_from_host(&host(2.0), 0).unwrap();
    let out = exe.execute(&[[&state, &delta]]).unwrap();
    // Not donated: the plugin copies instead of writing into `state`.
    assert_ne!(
        out[0][0].device_address().unwrap(),
        state.device_address().unwrap()
    );
    assert!(!state.is_deleted().unwrap());
    assert_eq!(state.to_vec::<f32>().unwrap(), vec![1.0; 1024]);
    assert_eq!(out[0][0].to_vec::<f32>().unwrap(), vec![3.0; 1024]);
}

#[test]
fn donating_to_a_program_without_aliasing_still_computes() {
    let client = client(1);
    let exe = client
        .compile(&step_program(1, false), &CompileOptions::single_device())
        .unwrap();
    let state = client.buffer_from_host(&host(1.0), 0).unwrap();
    let delta = client.buffer_from_host(&host(2.0), 0).unwrap();
    let out = exe
        .execute_donating(vec![vec![Argument::Donated(state), Argument::Lent(&delta)]])
        .unwrap();
    assert_eq!(out[0][0].to_vec::<f32>().unwrap(), vec![3.0; 1024]);
}

#[test]
fn donation_must_agree_across_devices() {
    let client = client(2);
    let exe = client
        .compile(
            &step_program(2, true),
            &CompileOptions::replicated(2).unwrap(),
        )
        .unwrap();
    let [s0, d0] = [host(1.0), host(2.0)].map(|h| client.buffer_from_host(&h, 0).unwrap());
    let [s1, d1] = [host(1.0), host(2.0)].map(|h| client.buffer_from_host(&h, 1).unwrap());
    let err = exe
        .execute_donating(vec![
            vec![Argument::Donated(s0), Argument::Lent(&d0)],
            vec![Argument::Lent(&s1), Argument::Lent(&d1)],
        ])
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::DonationMismatch {
                argument: 0,
                list: 1
            }
        ),
        "{err}"
    );
    assert!(err
        .to_string()
        .contains("donate an argument on every device or on none"));
    // Nothing ran: the lent buffers are intact.
    assert_eq!(s1.to_vec::<f32>().unwrap(), vec![1.0; 1024]);
}
