//! Run-time checks of what the types cannot know: sizes, device counts, host arrays. Each
//! is an error with a message naming the dim, its size and the axis; nothing panics.

mod common;

use common::client;
use tessera_collectives::prelude::*;
use tessera_collectives::{host, Collective};
use tessera_hlo::{DType, Module};
use tessera_runtime::HostBuffer;

mesh!(Ring = [Context]);
mesh!(DataContext = [Data, Context]);

type Seq = (Replicated, Replicated, Split<Context>, Replicated);

fn ring4() -> Mesh<Ring> {
    Mesh::new([4]).unwrap()
}

fn build_err(body: impl FnOnce(&Spmd<'_, Ring>) -> Result<(), CollectiveError>) -> String {
    Program::build("e", &ring4(), body).unwrap_err().to_string()
}

fn contains_all(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "`{p}` expected in: {msg}");
    }
}

#[test]
fn argument_not_divisible_by_the_axis() {
    let e = build_err(|p| {
        p.arg::<Seq>([1, 8, 10, 4], DType::F32)?;
        Ok(())
    });
    contains_all(
        &e,
        &[
            "argument #0",
            "dim 2",
            "size 10",
            "not divisible by 4",
            "`context`",
        ],
    );
}

#[test]
fn all_to_all_split_dim_not_divisible() {
    // 6 heads cannot be split over 4 devices.
    let e = build_err(|p| {
        let q = p.arg::<Seq>([1, 6, 16, 4], DType::F32)?;
        q.all_to_all::<Context, 1, 2>()?;
        Ok(())
    });
    contains_all(
        &e,
        &[
            "all_to_all over `context`",
            "dim 1",
            "size 6",
            "not divisible by 4",
        ],
    );
}

#[test]
fn reduce_scatter_dim_not_divisible() {
    let e = build_err(|p| {
        let x = p.arg::<(Replicated, Replicated)>([3, 2], DType::F32)?;
        x.vary::<Context>()?.reduce_scatter::<Context, 0>()?;
        Ok(())
    });
    contains_all(
        &e,
        &["reduce_scatter over `context`", "dim 0", "size 3", "by 4"],
    );
}

#[test]
fn an_axis_used_twice_is_rejected() {
    let e = build_err(|p| {
        let x = p.arg::<(Replicated, Replicated)>([4, 4], DType::F32)?;
        x.map_local_as::<(Split<Context>, Split<Context>), Invariant>(|_, v| Ok(v))?;
        Ok(())
    });
    contains_all(&e, &["P(context, context)", "`context` is used twice"]);
    let e = build_err(|p| {
        let x = p.arg::<(Split<Context>,)>([4], DType::F32)?;
        x.vary::<Context>()?;
        Ok(())
    });
    contains_all(&e, &["varying over context", "used twice"]);
}

#[test]
fn local_op_rank_must_match_the_layout() {
    let e = build_err(|p| {
        let x = p.arg::<(Replicated, Replicated)>([4, 4], DType::F32)?;
        x.map_local(|f, v| Ok(f.reshape(v, &[16])?))?;
        Ok(())
    });
    contains_all(&e, &["map_local", "2 dims", "rank 1"]);
}

#[test]
fn local_results_are_checked_against_their_types() {
    // As many values as typed results, each of its declared rank.
    let e = build_err(|p| {
        let x = p.arg::<Seq>([1, 4, 8, 2], DType::F32)?;
        let _: (DTensor<'_, Ring, Seq>, DTensor<'_, Ring, Seq>) =
            p.local_results(&[&x], |_, v| Ok(vec![v[0]]))?;
        Ok(())
    });
    contains_all(&e, &["local op", "returned 1 values for 2 typed results"]);
    let e = build_err(|p| {
        let x = p.arg::<Seq>([1, 4, 8, 2], DType::F32)?;
        let _: (DTensor<'_, Ring, Seq>, DTensor<'_, Ring, (Replicated,)>) =
            p.local_results(&[&x], |_, v| Ok(vec![v[0], v[0]]))?;
        Ok(())
    });
    contains_all(&e, &["declare", "1 dims", "rank 4"]);
    // Right counts and ranks: typed results with their layouts.
    Program::build("ok", &ring4(), |p| {
        let x = p.arg::<Seq>([1, 4, 8, 2], DType::F32)?;
        type Partial = (Replicated, Replicated, Replicated, Replicated);
        let (a, b): (
            DTensor<'_, Ring, Seq>,
            DTensor<'_, Ring, Partial, Varying<Context>>,
        ) = p.local_results(&[&x], |f, v| Ok(vec![f.exp(v[0])?, v[0]]))?;
        assert_eq!(a.layout().spec.to_string(), "P(None, None, context, None)");
        assert_eq!(b.layout().varying, Some("context"));
        a.output::<Seq>()
    })
    .unwrap();
}

#[test]
fn tensor_ops_inside_a_local_closure_are_an_error() {
    let e = build_err(|p| {
        let x = p.arg::<Seq>([1, 4, 8, 2], DType::F32)?;
        x.map_local(|_, v| {
            x.all_gather::<Context, 2>()?;
            Ok(v)
        })?;
        Ok(())
    });
    contains_all(&e, &["all_gather", "busy"]);
}

#[test]
fn invalid_permutations() {
    let e = build_err(|p| {
        let x = p.arg::<(Split<Context>,)>([4], DType::F32)?;
        x.ppermute::<Context, 0>(&[(0, 1), (2, 1)])?;
        Ok(())
    });
    contains_all(&e, &["ppermute over `context`", "target 1 appears twice"]);
    let e = build_err(|p| {
        let x = p.arg::<(Split<Context>,)>([4], DType::F32)?;
        x.ppermute::<Context, 0>(&[(0, 4)])?;
        Ok(())
    });
    contains_all(&e, &["position 4 is out of range", "4 devices"]);
}

#[test]
fn module_partitions_must_match_the_mesh() {
    let mut m = Module::new("m");
    m.set_num_partitions(2).unwrap();
    let e = Spmd::new(m.func("main"), &ring4()).unwrap_err().to_string();
    contains_all(&e, &["mhlo.num_partitions = 2", "expected 4 devices"]);
    // The untyped collectives check it too.
    let mut f = m.func("g");
    let x = f
        .arg(tessera_hlo::TensorType::new([4], DType::F32))
        .unwrap();
    let c = Collective::Psum {
        axis: ring4().axis::<Context>(),
    };
    let e = c.emit(&mut f, x).unwrap_err().to_string();
    contains_all(&e, &["psum over `context`", "expected 4 devices", "got 2"]);
}

#[test]
fn device_counts_and_input_shapes_at_run_time() {
    let program = Program::build("p", &ring4(), |p| {
        let x = p.arg::<Seq>([1, 4, 8, 2], DType::F32)?;
        x.output::<Seq>()
    })
    .unwrap();
    // A client with fewer devices than the mesh.
    let e = program.compile(&client(2)).unwrap_err().to_string();
    contains_all(&e, &["expected 4 devices", "got 2"]);
    let exe = program.compile(&client(4)).unwrap();
    let shard = HostBuffer::from_slice(&[1, 4, 2, 2], &[0f32; 16]).unwrap();
    let e = exe
        .run(&vec![vec![shard.clone()]; 3])
        .unwrap_err()
        .to_string();
    contains_all(
        &e,
        &["per-device input lists", "expected 4 devices", "got 3"],
    );
    let wrong = HostBuffer::from_slice(&[1, 4, 8, 2], &[0f32; 64]).unwrap();
    let mut inputs = vec![vec![shard.clone()]; 4];
    inputs[2][0] = wrong.clone();
    let e = exe.run(&inputs).unwrap_err().to_string();
    contains_all(
        &e,
        &[
            "device 2, input #0",
            "tensor<1x4x2x2xf32>",
            "P(None, None, context, None)",
        ],
    );
    let e = exe.run(&vec![vec![]; 4]).unwrap_err().to_string();
    contains_all(&e, &["0 inputs given", "takes 1"]);
    let e = exe.run_global(&[shard]).unwrap_err().to_string();
    contains_all(&e, &["input #0", "tensor<1x4x8x2xf32>"]);
    let bf = HostBuffer::from_slice(&[1, 4, 2, 2], &[half::bf16::ZERO; 16]).unwrap();
    let e = exe.run(&vec![vec![bf]; 4]).unwrap_err().to_string();
    contains_all(&e, &["BF16"]);
}

#[test]
fn host_helpers_check_their_inputs() {
    let mesh = Mesh::<DataContext>::new([2, 2]).unwrap();
    let spec = PartitionSpec(vec![tessera_collectives::DimSpec::Split("data")]);
    let g = HostBuffer::from_slice(&[3], &[1f32, 2.0, 3.0]).unwrap();
    let e = host::shard(&g, &spec, &mesh).unwrap_err().to_string();
    contains_all(&e, &["dim 0", "size 3", "`data`"]);
    let e = host::unshard(std::slice::from_ref(&g), &spec, &mesh)
        .unwrap_err()
        .to_string();
    contains_all(&e, &["expected 4 devices", "got 1"]);
    let bad = PartitionSpec(vec![tessera_collectives::DimSpec::Split("fsdp")]);
    let e = host::shard(&g, &bad, &mesh).unwrap_err().to_string();
    contains_all(&e, &["no axis `fsdp`"]);
    let e = host::shard_of(&g, &PartitionSpec(vec![]), &mesh, 0)
        .unwrap_err()
        .to_string();
    contains_all(&e, &["0 dims", "rank 1"]);
}
