//! The typed splash calls of `tessera_parallel::local_splash` used directly, as a user composes them:
//! a Ulysses program on a `data` x `context` mesh (batch split over `data`, which the
//! built-in strategies do not do) gives the dense float64 reference, and so does its
//! gradient built in the same program; an op built from another
//! strategy's configuration, or run on a mesh its kernels were not built for, is an error that
//! names the op and the operand.

mod common;

use common::{assert_close, random};
use tessera_collectives::prelude::*;
use tessera_dsl::{DType, HostArray, Lowering};
use tessera_parallel::local_splash::{AllGatherAttention, RingAttention, UlyssesAttention};
use tessera_parallel::strategy::{Ring, Ulysses, Usp};
use tessera_parallel::{ContextMesh, ContextParallel, CpError, Strategy};
use tessera_runtime::{Client, HostBuffer};
use tessera_splash::reference::{self, RefInputs};
use tessera_splash::{BlockSizes, Dims, Mask};

mesh!(DataContext = [Data, Context]);

const HEAD_DIM: usize = 64;

/// A configuration of `strategy` whose kernels see `batch` batch elements per device.
fn config(strategy: Strategy, devices: usize, batch: usize, seq: usize) -> ContextParallel {
    ContextParallel {
        dims: Dims {
            batch,
            heads: 4,
            kv_heads: 2,
            q_len: seq,
            kv_len: seq,
            head_dim: HEAD_DIM,
            head_dim_v: HEAD_DIM,
        },
        dtype: DType::F32,
        mask: Mask::causal(),
        block_sizes: BlockSizes::uniform(64, 64),
        options: Default::default(),
        strategy,
        devices,
        load_balance: false,
        lowering: Lowering::portable(),
    }
}

#[test]
fn ulysses_op_with_the_batch_split_over_data_matches_the_reference() {
    // 2 x 2 devices: the batch (2) over `data`, the sequence over `context`.
    let (seq, batch) = (256, 2);
    let cp = config(Strategy::from(Ulysses), 2, batch / 2, seq);
    let attention = UlyssesAttention::<Context>::new(&cp).unwrap();
    type BySeq = (Split<Data>, Replicated, Split<Context>, Replicated);
    type BySeqLse = (Split<Data>, Replicated, Split<Context>);
    let mesh = Mesh::<DataContext>::new([2, 2]).unwrap();
    let (b, s, d) = (batch as i64, seq as i64, HEAD_DIM as i64);
    let program = Program::build("ulysses_data_context", &mesh, |p| {
        let q = p.arg::<BySeq>([b, 4, s, d], DType::F32)?;
        let k = p.arg::<BySeq>([b, 2, s, d], DType::F32)?;
        let v = p.arg::<BySeq>([b, 2, s, d], DType::F32)?;
        let q = q.all_to_all::<Context, 1, 2>()?;
        let k = k.all_to_all::<Context, 1, 2>()?;
        let v = v.all_to_all::<Context, 1, 2>()?;
        let (out, lse) = attention.forward(p, &q, &k, &v, None)?;
        out.all_to_all::<Context, 2, 1>()?.output::<BySeq>()?;
        lse.all_to_all::<Context, 2, 1>()?.output::<BySeqLse>()
    })
    .unwrap();

    let q = random(DType::F32, &[batch, 4, seq, HEAD_DIM], 11);
    let k = random(DType::F32, &[batch, 2, seq, HEAD_DIM], 12);
    let v = random(DType::F32, &[batch, 2, seq, HEAD_DIM], 13);
    let client = Client::cpu_shared(4).unwrap();
    let exe = program.compile(&client).unwrap();
    let inputs: Vec<HostBuffer> = [&q, &k, &v]
        .iter()
        .map(|a| HostBuffer::from_array(a).unwrap())
        .collect();
    let outs: Vec<HostArray> = exe
        .run_global(&inputs)
        .unwrap()
        .iter()
        .map(|b| b.to_array().unwrap())
        .collect();

    let mask = Mask::causal().into();
    let (qf, kf, vf) = (q.to_f64_vec(), k.to_f64_vec(), v.to_f64_vec());
    let want = reference::forward(&RefInputs::new(
        Dims { batch, ..cp.dims },
        (&qf, &kf, &vf),
        &mask,
        1.0 / (HEAD_DIM as f64).sqrt(),
    ));
    assert_eq!(outs[0].shape(), q.shape());
    assert_close(&outs[0].to_f64_vec(), &want.out, 2e-4, "out");
    assert_close(&outs[1].to_f64_vec(), &want.lse, 2e-4, "lse");
}

#[test]
fn ulysses_forward_and_gradient_in_one_program_match_the_reference() {
    // What a train step builds: the forward and, in the same program, its gradient through
    // `Spmd::vjp` (the splash kernel's custom VJP, the all-to-alls' transposes), reusing the
    // forward's results. The batch is split over `data`, the sequence over `context`.
    let (seq, batch) = (256, 2);
    let cp = config(Strategy::from(Ulysses), 2, batch / 2, seq);
    let attention = UlyssesAttention::<Context>::new(&cp).unwrap();
    type BySeq = (Split<Data>, Replicated, Split<Context>, Replicated);
    type BySeqLse = (Split<Data>, Replicated, Split<Context>);
    let mesh = Mesh::<DataContext>::new([2, 2]).unwrap();
    let (b, s, d) = (batch as i64, seq as i64, HEAD_DIM as i64);
    let program = Program::build("ulysses_train_step", &mesh, |p| {
        let q = p.arg::<BySeq>([b, 4, s, d], DType::F32)?;
        let k = p.arg::<BySeq>([b, 2, s, d], DType::F32)?;
        let v = p.arg::<BySeq>([b, 2, s, d], DType::F32)?;
        let dout = p.arg::<BySeq>([b, 4, s, d], DType::F32)?;
        let (qh, kh, vh) = (
            q.all_to_all::<Context, 1, 2>()?,
            k.all_to_all::<Context, 1, 2>()?,
            v.all_to_all::<Context, 1, 2>()?,
        );
        let (out, lse) = attention.forward(p, &qh, &kh, &vh, None)?;
        let out = out.all_to_all::<Context, 2, 1>()?;
        out.output::<BySeq>()?;
        lse.all_to_all::<Context, 2, 1>()?.output::<BySeqLse>()?;
        for g in p.vjp(&[&out], &[&dout], &[&q, &k, &v])? {
            p.declare::<BySeq, Invariant>(g)?.output::<BySeq>()?;
        }
        Ok(())
    })
    .unwrap();
    // 5 forward all-to-alls, dout's, and dq's, dk's, dv's: nothing is computed twice.
    let names: Vec<&str> = program
        .collectives()
        .iter()
        .map(|c| c.collective.name())
        .collect();
    assert_eq!(names, ["all_to_all"; 9]);

    let q = random(DType::F32, &[batch, 4, seq, HEAD_DIM], 21);
    let k = random(DType::F32, &[batch, 2, seq, HEAD_DIM], 22);
    let v = random(DType::F32, &[batch, 2, seq, HEAD_DIM], 23);
    let dout = random(DType::F32, &[batch, 4, seq, HEAD_DIM], 24);
    let exe = program.compile(&Client::cpu_shared(4).unwrap()).unwrap();
    let inputs: Vec<HostBuffer> = [&q, &k, &v, &dout]
        .iter()
        .map(|a| HostBuffer::from_array(a).unwrap())
        .collect();
    let outs: Vec<Vec<f64>> = exe
        .run_global(&inputs)
        .unwrap()
        .iter()
        .map(|b| b.to_array().unwrap().to_f64_vec())
        .collect();
    let mask = Mask::causal().into();
    let (qf, kf, vf) = (q.to_f64_vec(), k.to_f64_vec(), v.to_f64_vec());
    let r = RefInputs::new(
        Dims { batch, ..cp.dims },
        (&qf, &kf, &vf),
        &mask,
        1.0 / (HEAD_DIM as f64).sqrt(),
    );
    let want = reference::forward(&r);
    assert_close(&outs[0], &want.out, 2e-4, "out");
    assert_close(&outs[1], &want.lse, 2e-4, "lse");
    let grads = reference::backward(&r, &dout.to_f64_vec());
    for (name, got, want) in [
        ("dq", &outs[2], &grads.dq),
        ("dk", &outs[3], &grads.dk),
        ("dv", &outs[4], &grads.dv),
    ] {
        let scale = want.iter().fold(0f64, |m, x| m.max(x.abs()));
        assert_close(got, want, 1e-3 * scale, name);
    }
}

#[test]
fn an_op_is_built_from_its_own_strategy() {
    let ring = config(Strategy::from(Ring), 2, 1, 256);
    let message = |e: CpError| e.to_string();
    let e = message(UlyssesAttention::<Context>::new(&ring).unwrap_err());
    assert!(
        e.contains("Ulysses attention op") && e.contains("ring"),
        "{e}"
    );
    let e = message(AllGatherAttention::<Context>::new(&ring).unwrap_err());
    assert!(
        e.contains("all-gather attention op") && e.contains("ring"),
        "{e}"
    );
    // An op checks what the configuration's devices hold, not which strategy built it: a
    // Ulysses configuration's devices hold the whole sequence for their heads, which is a
    // ring of one step (USP with a ring degree of 1).
    let ulysses = config(Strategy::from(Ulysses), 2, 1, 256);
    assert_eq!(RingAttention::<Context>::new(&ulysses).unwrap().steps(), 1);
    let e = message(AllGatherAttention::<Context>::new(&ulysses).unwrap_err());
    assert!(
        e.contains("ulysses: the all-gather attention op attends 128 queries against 256 keys")
            && e.contains("hold 256 against 256"),
        "{e}"
    );
    assert_eq!(
        RingAttention::<Context>::new(&config(
            Strategy::from(Usp {
                ulysses: 2,
                ring: 2
            }),
            4,
            1,
            256
        ))
        .unwrap()
        .steps(),
        2
    );
}

#[test]
fn an_op_on_a_mesh_its_kernels_were_not_built_for_names_the_operand() {
    // Kernels for 2 devices (2 heads each), a program on 4 (1 head each).
    let attention =
        UlyssesAttention::<Context>::new(&config(Strategy::from(Ulysses), 2, 1, 256)).unwrap();
    type BySeq = (Replicated, Replicated, Split<Context>, Replicated);
    let mesh = Mesh::<ContextMesh>::new([4]).unwrap();
    let e = Program::build("ulysses", &mesh, |p| {
        let [q, k, v] = [(); 3].map(|()| p.arg::<BySeq>([1, 4, 256, 64], DType::F32));
        let q = q?.all_to_all::<Context, 1, 2>()?;
        let k = k?.all_to_all::<Context, 1, 2>()?;
        let v = v?.all_to_all::<Context, 1, 2>()?;
        attention.forward(p, &q, &k, &v, None)?;
        Ok(())
    })
    .unwrap_err()
    .to_string();
    for part in [
        "Ulysses attention: q",
        "[1, 1, 256, 64]",
        "built for [1, 2, 256, 64]",
    ] {
        assert!(e.contains(part), "`{part}` expected in: {e}");
    }
}
