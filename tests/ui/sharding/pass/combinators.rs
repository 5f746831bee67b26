//! Every combinator type-checks with the result sharding it documents, on a 2-D mesh.
use tessera_collectives::prelude::*;
use tessera_hlo::DType;

axis!(Context = "context");
axis!(Data = "data");

mesh!(Dc = [Data, Context]);

type X = (Split<Data>, Replicated, Split<Context>, Replicated);
type Rows = (Split<Data>, Replicated, Replicated, Replicated);

fn main() -> Result<(), CollectiveError> {
    let mesh = Mesh::<Dc>::new([2, 4])?;
    let program = Program::build("combinators", &mesh, |p| {
        let x: DTensor<'_, Dc, X> = p.arg([2, 8, 16, 4], DType::F32)?;

        // all_to_all: the split moves from dim 2 to dim 1 (and back).
        let a: DTensor<'_, Dc, (Split<Data>, Split<Context>, Replicated, Replicated)> =
            x.all_to_all::<Context, 1, 2>()?;
        let back: DTensor<'_, Dc, X> = a.all_to_all::<Context, 2, 1>()?;
        // all_to_all over the other axis: batch split moves from dim 0 to dim 3.
        let b: DTensor<'_, Dc, (Replicated, Replicated, Split<Context>, Split<Data>)> =
            x.all_to_all::<Data, 3, 0>()?;

        // all_gather: dim 2 becomes whole.
        let g: DTensor<'_, Dc, Rows> = x.all_gather::<Context, 2>()?;

        // ppermute / ring shift keep the sharding.
        let r: DTensor<'_, Dc, X> = x.ring_shift::<Context, 2>(-1)?;
        let pp: DTensor<'_, Dc, X> = x.ppermute::<Data, 0>(&[(0, 1), (1, 0)])?;

        // A local op's partial result varies over `context`; psum / reduce_scatter sum it.
        let part: DTensor<'_, Dc, Rows, Varying<Context>> =
            g.map_local_as(|f, v| Ok(f.mul(v, v)?))?;
        let s: DTensor<'_, Dc, Rows, Invariant> = part.psum::<Context>()?;
        let rs: DTensor<'_, Dc, (Split<Data>, Split<Context>, Replicated, Replicated)> =
            part.reduce_scatter::<Context, 1>()?;

        // vary is psum's transpose; axis_index varies over its axis.
        let twice: DTensor<'_, Dc, Rows> = g.vary::<Context>()?.psum::<Context>()?;
        let i: DTensor<'_, Dc, (), Varying<Data>> = p.axis_index::<Data>()?;
        let _ = i;

        // Elementwise ops on equal shardings; local ops through the builder.
        let sum = g.add(&s)?.sub(&twice)?.mul(&g)?;
        let sum = sum.map_local(|f, v| Ok(f.exp(v)?))?;
        let raw = p.local_values(&[&sum, &g], |f, a| Ok(vec![f.add(a[0], a[1])?]))?;
        let declared: DTensor<'_, Dc, Rows> = p.declare::<Rows, Invariant>(raw[0])?;
        let converted = declared.convert(DType::BF16)?;

        back.output::<X>()?;
        b.output::<(Replicated, Replicated, Split<Context>, Split<Data>)>()?;
        r.output::<X>()?;
        pp.output::<X>()?;
        rs.output::<(Split<Data>, Split<Context>, Replicated, Replicated)>()?;
        converted.output::<Rows>()
    })?;
    let text = program.to_mlir();
    for op in [
        "all_to_all",
        "all_gather",
        "collective_permute",
        "all_reduce",
        "reduce_scatter",
        "partition_id",
    ] {
        assert!(
            text.contains(&format!("\"stablehlo.{op}\"")),
            "{op} missing:\n{text}"
        );
    }
    assert_eq!(program.outputs().len(), 6);
    assert_eq!(program.outputs()[5].global.dims, vec![2, 8, 16, 4]);
    Ok(())
}
