//! `Spmd::scan` on 4 devices: a loop whose body runs collectives (all-to-all there and back,
//! an all-gather) over per-iteration rows of a stacked weight equals the same body unrolled,
//! forward and VJP; what belongs to the function is refused inside a body.

mod common;

use common::{client, from_buffer, to_buffer, Arr};
use tessera_collectives::prelude::*;
use tessera_hlo::{DType, Reducer, Value};
use tessera_runtime::HostBuffer;

mesh!(Ring = [Context]);

const N: usize = 4;
const LAYERS: usize = 3;
/// Global `[B, H, S, D]`.
const DIMS: [usize; 4] = [2, 4, 8, 3];

type Seq = (Replicated, Replicated, Split<Context>, Replicated);
/// `[L, D]` stacked per-layer scales: every device holds them all.
type Stacked = (Replicated, Replicated);

/// One layer: to heads, `tanh(0.05 h w)` (scaled per feature by this layer's `w [D]`), back to
/// the sequence, then half of it plus half the sequence mean of the all-gathered result.
fn layer<'q>(
    h: &DTensor<'q, Ring, Seq>,
    w: Value,
) -> Result<DTensor<'q, Ring, Seq>, CollectiveError> {
    let heads = h.all_to_all::<Context, 1, 2>()?;
    let heads = heads.map_local(|f, x| {
        let dims = f.value_type(x)?.dims.clone();
        let wb = f.broadcast_in_dim(w, &dims, &[3])?;
        let c = f.splat(0.05, f.value_type(x)?.clone())?;
        let y = f.mul(x, wb)?;
        let y = f.mul(y, c)?;
        Ok(f.tanh(y)?)
    })?;
    let back = heads.all_to_all::<Context, 2, 1>()?;
    let whole = back.all_gather::<Context, 2>()?;
    let g = whole.value();
    back.map_local(|f, x| {
        let dims = f.value_type(x)?.dims.clone();
        let s = f.value_type(g)?.dims[2];
        let mean = f.reduce(g, &[2], Reducer::Sum)?;
        let mean = f.broadcast_in_dim(mean, &dims, &[0, 1, 3])?;
        let k = f.splat(0.5 / s as f64, f.value_type(x)?.clone())?;
        let half = f.splat(0.5, f.value_type(x)?.clone())?;
        let a = f.mul(x, half)?;
        let b = f.mul(mean, k)?;
        Ok(f.add(a, b)?)
    })
}

/// `h0 [B,H,S,D]`, `w [L, D]`, `ct`: returns the final `h`, `d<h, ct>/dh0` and `/dw`.
fn program(scanned: bool) -> Program<Ring> {
    let mesh = Mesh::<Ring>::new([N]).unwrap();
    let g = DIMS.map(|d| d as i64);
    Program::build("layers", &mesh, |p| {
        let h0 = p.arg::<Seq>(g, DType::F32)?;
        let w = p.arg::<Stacked>([LAYERS as i64, g[3]], DType::F32)?;
        let ct = p.arg::<Seq>(g, DType::F32)?;
        let h = if scanned {
            p.scan(LAYERS, &h0, &w, |_p, _i, h, w_row| layer(&h, w_row.value()))?
        } else {
            let mut h = h0.clone();
            for l in 0..LAYERS as i64 {
                let row = p.with_builder(|f| {
                    let r = f.slice(w.value(), &[l, 0], &[l + 1, g[3]])?;
                    Ok(f.reshape(r, &[g[3]])?)
                })?;
                h = layer(&h, row)?;
            }
            h
        };
        let grads = p.vjp(&[&h], &[&ct], &[&h0, &w])?;
        h.output::<Seq>()?;
        p.declare::<Seq, Invariant>(grads[0])?.output::<Seq>()?;
        // Each device's share of the replicated weight's gradient.
        p.declare::<Stacked, Invariant>(grads[1])?
            .output::<Stacked>()
    })
    .unwrap()
}

fn run(program: &Program<Ring>) -> Vec<Vec<Arr>> {
    let mut rng = fastrand::Rng::with_seed(7);
    let local = [DIMS[0], DIMS[1], DIMS[2] / N, DIMS[3]];
    let w = Arr::random(&[LAYERS, DIMS[3]], &mut rng);
    let inputs: Vec<Vec<HostBuffer>> = (0..N)
        .map(|_| {
            vec![
                to_buffer(&Arr::random(&local, &mut rng), DType::F32),
                to_buffer(&w, DType::F32),
                to_buffer(&Arr::random(&local, &mut rng), DType::F32),
            ]
        })
        .collect();
    let out = program.compile(&client(N)).unwrap().run(&inputs).unwrap();
    out.iter()
        .map(|d| d.iter().map(from_buffer).collect())
        .collect()
}

#[test]
fn scan_with_collectives_equals_unrolled_forward_and_vjp() {
    let scanned = program(true);
    let unrolled = program(false);
    let text = scanned.to_mlir();
    assert_eq!(
        text.matches("stablehlo.while").count(),
        2,
        "a forward and a backward loop"
    );
    // The forward's three collectives are emitted once, in the body, and their transposes
    // once, in the backward loop (unrolled: once per layer each).
    let names: Vec<&str> = scanned
        .collectives()
        .iter()
        .map(|c| c.collective.name())
        .collect();
    assert_eq!(
        names,
        [
            "all_to_all",
            "all_to_all",
            "all_gather",
            "reduce_scatter",
            "all_to_all",
            "all_to_all"
        ]
    );
    assert_eq!(unrolled.collectives().len(), 2 * 3 * LAYERS);

    let (a, b) = (run(&scanned), run(&unrolled));
    let mut worst = 0f32;
    for (da, db) in a.iter().zip(&b) {
        for (x, y) in da.iter().zip(db) {
            assert_eq!(x.dims, y.dims);
            for (u, v) in x.data.iter().zip(&y.data) {
                worst = worst.max((u - v).abs() / (1.0 + v.abs()));
            }
        }
    }
    assert!(
        worst <= 1e-5,
        "scanned vs unrolled: max rel. difference {worst}"
    );
    // The gradient is not trivially zero.
    assert!(a[0][2].data.iter().any(|&x| x.abs() > 1e-3));
}

#[test]
fn function_ops_inside_a_scan_body_are_refused() {
    let mesh = Mesh::<Ring>::new([N]).unwrap();
    let err = Program::build("bad", &mesh, |p| {
        let h0 = p.arg::<Seq>(DIMS.map(|d| d as i64), DType::F32)?;
        let h = p.scan(2, &h0, &(), |p, _i, h, ()| {
            p.arg::<Seq>(DIMS.map(|d| d as i64), DType::F32)?;
            Ok(h)
        })?;
        h.output::<Seq>()
    })
    .unwrap_err();
    assert!(err.to_string().contains("inside a scan body"), "{err}");

    let err = Program::build("bad", &mesh, |p| {
        let h0 = p.arg::<Seq>(DIMS.map(|d| d as i64), DType::F32)?;
        let w = p.arg::<Stacked>([LAYERS as i64, 3], DType::F32)?;
        let h = p.scan(LAYERS + 1, &h0, &w, |_p, _i, h, _w| Ok(h))?;
        h.output::<Seq>()
    })
    .unwrap_err();
    assert!(err.to_string().contains("stacked along dim 0"), "{err}");
}
