//! Ulysses attention from the typed collectives: the sequence-sharded `q, k, v` are re-sharded
//! to heads by an all-to-all, each device runs splash attention on its heads over the whole
//! sequence, and the inverse all-to-all brings the output back. The shardings are in the
//! types: leaving out an all-to-all does not compile. Runs on 4 virtual CPU devices and is
//! checked against one device's dense attention.
//!
//! ```sh
//! cargo run --release --example ulysses
//! ```

use tessera::collectives::axes::Context;
use tessera::collectives::{Mesh, Program, Replicated, Split};
use tessera::dsl::{DType, HostArray, Lowering};
use tessera::parallel::local_splash::UlyssesAttention;
use tessera::parallel::strategy::Ulysses;
use tessera::parallel::{ContextMesh, ContextParallel};
use tessera::runtime::{Client, HostBuffer};
use tessera::splash::{BlockSizes, Dims, Mask};

/// `[B, H, S, D]` with the sequence split over `context`: what each device holds.
type BySequence = (Replicated, Replicated, Split<Context>, Replicated);
/// `[B, H, S]`.
type BySequenceLse = (Replicated, Replicated, Split<Context>);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (devices, heads, seq, d) = (4, 8, 512, 32);
    let cp = ContextParallel {
        dims: Dims {
            batch: 1,
            heads,
            kv_heads: heads,
            q_len: seq,
            kv_len: seq,
            head_dim: d,
            head_dim_v: d,
        },
        dtype: DType::F32,
        mask: Mask::causal(),
        block_sizes: BlockSizes::uniform(128, 128),
        options: Default::default(),
        strategy: Ulysses.into(),
        devices,
        load_balance: false,
        lowering: Lowering::portable(),
    };
    let attention = UlyssesAttention::<Context>::new(&cp)?;
    let shape = [1, heads as i64, seq as i64, d as i64];
    let program = Program::build("ulysses", &Mesh::<ContextMesh>::new([devices])?, |p| {
        let q = p.arg::<BySequence>(shape, DType::F32)?;
        let k = p.arg::<BySequence>(shape, DType::F32)?;
        let v = p.arg::<BySequence>(shape, DType::F32)?;
        // Sequence to heads: [B, H, S/U, D] -> [B, H/U, S, D].
        let (q, k, v) = (
            q.all_to_all::<Context, 1, 2>()?,
            k.all_to_all::<Context, 1, 2>()?,
            v.all_to_all::<Context, 1, 2>()?,
        );
        let (out, lse) = attention.forward(p, &q, &k, &v, None)?;
        // And back.
        out.all_to_all::<Context, 2, 1>()?.output::<BySequence>()?;
        lse.all_to_all::<Context, 2, 1>()?.output::<BySequenceLse>()
    })?;
    for c in program.collectives() {
        println!(
            "{:<11} over {} of {}",
            c.collective.name(),
            c.collective.axis().name(),
            c.input_type
        );
    }
    let exe = program.compile(&Client::cpu_shared(devices)?)?;
    let [q, k, v] = [1, 2, 3].map(|s| HostArray::random(DType::F32, [1, heads, seq, d], s));
    let inputs = [&q, &k, &v].map(|a| HostBuffer::from_array(a).expect("f32 arrays"));
    let out = exe.run_global(&inputs)?[0].to_array()?.to_f64_vec();

    // One device, dense: softmax(q k^T / sqrt(d)) v per head, causal.
    let (qf, kf, vf) = (q.to_f64_vec(), k.to_f64_vec(), v.to_f64_vec());
    let mut err: f64 = 0.0;
    for h in 0..heads {
        let head = |x: &[f64]| x[h * seq * d..(h + 1) * seq * d].to_vec();
        let want =
            tessera::reference::attention_ref(&head(&qf), &head(&kf), &head(&vf), seq, d, true);
        for (g, w) in out[h * seq * d..(h + 1) * seq * d].iter().zip(&want) {
            err = err.max((g - w).abs());
        }
    }
    println!("Ulysses on {devices} devices vs dense attention on one: max |err| {err:.1e}");
    assert!(err < 1e-4);
    Ok(())
}
