//! The all-gather and ring context-parallel strategies, type-checked: the all-gather one
//! gathers K/V along the sequence; the ring one rotates the K/V chunks around `context`
//! and accumulates.
use tessera_collectives::prelude::*;
use tessera_hlo::DType;

axis!(Context = "context");

mesh!(Cp = [Context]);

type SeqSharded = (Replicated, Replicated, Split<Context>, Replicated);
type Whole = (Replicated, Replicated, Replicated, Replicated);

/// Placeholder for one attention block of the local q chunk against a K/V chunk.
fn block<'p, SK: Layout<Cp>>(
    p: &'p Spmd<'_, Cp>,
    q: &DTensor<'p, Cp, SeqSharded>,
    k: &DTensor<'p, Cp, SK>,
    v: &DTensor<'p, Cp, SK>,
) -> Result<DTensor<'p, Cp, SeqSharded>, CollectiveError> {
    p.local::<SeqSharded, Invariant>(&[q, k, v], |f, a| Ok(f.tanh(a[0])?))
}

fn main() -> Result<(), CollectiveError> {
    const U: usize = 4;
    let mesh = Mesh::<Cp>::new([U])?;
    let all_gather = Program::build("all_gather_cp", &mesh, |p| {
        let q = p.arg::<SeqSharded>([1, 8, 64, 16], DType::BF16)?;
        let k = p.arg::<SeqSharded>([1, 8, 64, 16], DType::BF16)?;
        let v = p.arg::<SeqSharded>([1, 8, 64, 16], DType::BF16)?;
        let k: DTensor<'_, Cp, Whole> = k.all_gather::<Context, 2>()?;
        let v = v.all_gather::<Context, 2>()?;
        block(p, &q, &k, &v)?.output::<SeqSharded>()
    })?;
    assert_eq!(
        all_gather
            .to_mlir()
            .matches("\"stablehlo.all_gather\"")
            .count(),
        2
    );

    let ring = Program::build("ring_cp", &mesh, |p| {
        let q = p.arg::<SeqSharded>([1, 8, 64, 16], DType::BF16)?;
        let mut k = p.arg::<SeqSharded>([1, 8, 64, 16], DType::BF16)?;
        let mut v = p.arg::<SeqSharded>([1, 8, 64, 16], DType::BF16)?;
        let mut acc = block(p, &q, &k, &v)?;
        for _ in 1..U {
            k = k.ring_shift::<Context, 2>(1)?;
            v = v.ring_shift::<Context, 2>(1)?;
            acc = acc.add(&block(p, &q, &k, &v)?)?;
        }
        acc.output::<SeqSharded>()
    })?;
    assert_eq!(
        ring.to_mlir()
            .matches("\"stablehlo.collective_permute\"")
            .count(),
        2 * (U - 1)
    );
    Ok(())
}
