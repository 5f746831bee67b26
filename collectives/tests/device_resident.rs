//! SPMD programs whose state stays on the devices between runs: a donated, sharded state is
//! updated in place, run after run, and only copied to the host at the end.

use tessera_collectives::prelude::*;
use tessera_collectives::MeshArgument;
use tessera_hlo::DType;
use tessera_runtime::{Client, HostBuffer};

mesh!(DataContext = [Data, Context]);

type Rows = (Split<Data>, Split<Context>);

/// `state + delta`, with an input `x` of another sharding beside them; the state may be
/// donated to the result.
fn step(mesh: &Mesh<DataContext>, donate: bool) -> Program<DataContext> {
    let mut program = Program::build("step", mesh, |p| {
        let state = p.arg::<Rows>([4, 8], DType::F32)?;
        let _x = p.arg::<(Split<Data>, Replicated)>([4, 8], DType::F32)?;
        let delta = p.arg::<Rows>([4, 8], DType::F32)?;
        state.add(&delta)?.output::<Rows>()
    })
    .unwrap();
    if donate {
        program.donate(0, 0).unwrap();
    }
    program
}

fn host(values: impl Fn(usize) -> f32) -> HostBuffer {
    let data: Vec<f32> = (0..32).map(values).collect();
    HostBuffer::from_slice(&[4, 8], &data).unwrap()
}

#[test]
fn donated_sharded_state_is_updated_in_place_across_runs() {
    let mesh = Mesh::<DataContext>::new([2, 4]).unwrap();
    let program = step(&mesh, true);
    assert!(program.to_mlir().contains("tf.aliasing_output = 0 : i32"));
    let client = Client::cpu_shared(8).unwrap();
    let exe = program.compile(&client).unwrap();
    let zeros = host(|_| 0.0);
    let x = exe.upload(1, &zeros).unwrap();
    let delta = exe.upload(2, &host(|i| i as f32)).unwrap();
    let mut state = exe.upload(0, &host(|_| 1.0)).unwrap();
    for _ in 0..5 {
        let before: Vec<usize> = state
            .shards()
            .iter()
            .map(|b| b.device_address().unwrap())
            .collect();
        let mut out = exe
            .run_on_devices(vec![
                MeshArgument::Donated(state),
                MeshArgument::Lent(&x),
                MeshArgument::Lent(&delta),
            ])
            .unwrap();
        state = out.remove(0);
        let after: Vec<usize> = state
            .shards()
            .iter()
            .map(|b| b.device_address().unwrap())
            .collect();
        assert_eq!(before, after, "every shard is updated in place");
    }
    let result = exe.download(0, &state).unwrap();
    let expected: Vec<f32> = (0..32).map(|i| 1.0 + 5.0 * i as f32).collect();
    assert_eq!(result.to_vec::<f32>().unwrap(), expected);
}

#[test]
fn run_on_devices_names_an_input_of_the_wrong_shape() {
    let mesh = Mesh::<DataContext>::new([2, 4]).unwrap();
    let exe = step(&mesh, false)
        .compile(&Client::cpu_shared(8).unwrap())
        .unwrap();
    let a = exe.upload(0, &host(|_| 0.0)).unwrap();
    let b = exe.upload(1, &host(|_| 0.0)).unwrap();
    // Input 1 is split over `data` only: its shards do not fit input 0.
    let err = exe
        .run_on_devices(vec![
            MeshArgument::Lent(&b),
            MeshArgument::Lent(&b),
            MeshArgument::Lent(&a),
        ])
        .unwrap_err()
        .to_string();
    assert!(err.contains("input #0"), "{err}");
    assert!(err.contains("upload it with this executable"), "{err}");
    let err = exe
        .upload(0, &HostBuffer::from_slice(&[2], &[0f32, 1.0]).unwrap())
        .unwrap_err()
        .to_string();
    assert!(err.contains("the program takes"), "{err}");
}
