//! [`Spmd::scan`]: a counted loop whose body is built with every typed op, over typed carries
//! and stacked inputs.

use tessera_hlo::Value;

use crate::error::CollectiveError;
use crate::layout::{Invariant, Layout, Unstack, Variation};
use crate::mesh::MeshShape;
use crate::spmd::{declare, Spmd, TensorLayout};
use crate::tensor::DTensor;

/// What a [`Spmd::scan`] carries from one iteration to the next: a [`DTensor`], a `Vec` of
/// them, a tuple of up to 4 `ScanCarry`s (nested as deep as needed), or `()`. Each carried
/// tensor keeps its layout: the body receives and returns `At<'q>`, the same tensors of the
/// body's program.
pub trait ScanCarry<M> {
    /// The same tensors, of the program with lifetime `'q`.
    type At<'q>
    where
        M: 'q;
    /// Appends the per-device values, in order.
    fn push_values(&self, out: &mut Vec<Value>);
    /// Appends the per-device values of `at`, in order.
    fn push_values_at<'q>(at: &Self::At<'q>, out: &mut Vec<Value>)
    where
        M: 'q;
    /// Takes as many values from `values` as `self` holds and gives them `self`'s layouts in
    /// the program `p`.
    fn wrap_at<'q>(
        &self,
        p: &'q Spmd<'_, M>,
        values: &mut dyn Iterator<Item = Value>,
    ) -> Result<Self::At<'q>, CollectiveError>;
}

/// What a [`Spmd::scan`] reads row by row: a [`DTensor`] whose dim 0 is unsplit
/// ([`Unstack`]: its layout is `(Replicated, ...row's)`) and has the scan's length, a `Vec` of
/// them, a tuple of up to 4 `ScanXs`, or `()`. Iteration `i` receives `Rows<'q>`: row `i`
/// of each, dim 0 dropped, with the row's layout.
pub trait ScanXs<M> {
    /// The rows, tensors of the program with lifetime `'q`.
    type Rows<'q>
    where
        M: 'q;
    /// Appends the per-device (stacked) values, in order.
    fn push_values(&self, out: &mut Vec<Value>);
    /// Takes as many row values from `values` as `self` holds and gives them the rows'
    /// layouts in the program `p`.
    fn wrap_rows<'q>(
        &self,
        p: &'q Spmd<'_, M>,
        values: &mut dyn Iterator<Item = Value>,
    ) -> Result<Self::Rows<'q>, CollectiveError>;
}

/// The next value of a scan's carry or rows; the lists are built from the same trees, so a
/// missing value is this module's bug, reported rather than panicking.
fn next(values: &mut dyn Iterator<Item = Value>) -> Result<Value, CollectiveError> {
    values
        .next()
        .ok_or_else(|| CollectiveError::operand("scan", "fewer loop values than tensors"))
}

impl<M: MeshShape, S: Layout<M>, V: Variation<M>> ScanCarry<M> for DTensor<'_, M, S, V> {
    type At<'q>
        = DTensor<'q, M, S, V>
    where
        M: 'q;
    fn push_values(&self, out: &mut Vec<Value>) {
        out.push(self.value());
    }
    fn push_values_at<'q>(at: &Self::At<'q>, out: &mut Vec<Value>)
    where
        M: 'q,
    {
        out.push(at.value());
    }
    fn wrap_at<'q>(
        &self,
        p: &'q Spmd<'_, M>,
        values: &mut dyn Iterator<Item = Value>,
    ) -> Result<Self::At<'q>, CollectiveError> {
        declare(
            p.ctx(),
            next(values)?,
            TensorLayout::of::<M, S, V>(),
            "scan carry",
        )
    }
}

impl<M: MeshShape, S: Unstack<M>, V: Variation<M>> ScanXs<M> for DTensor<'_, M, S, V> {
    type Rows<'q>
        = DTensor<'q, M, S::Row, V>
    where
        M: 'q;
    fn push_values(&self, out: &mut Vec<Value>) {
        out.push(self.value());
    }
    fn wrap_rows<'q>(
        &self,
        p: &'q Spmd<'_, M>,
        values: &mut dyn Iterator<Item = Value>,
    ) -> Result<Self::Rows<'q>, CollectiveError> {
        declare(
            p.ctx(),
            next(values)?,
            TensorLayout::of::<M, S::Row, V>(),
            "scan row",
        )
    }
}

impl<M, T: ScanCarry<M>> ScanCarry<M> for Vec<T> {
    type At<'q>
        = Vec<T::At<'q>>
    where
        M: 'q;
    fn push_values(&self, out: &mut Vec<Value>) {
        self.iter().for_each(|t| t.push_values(out));
    }
    fn push_values_at<'q>(at: &Self::At<'q>, out: &mut Vec<Value>)
    where
        M: 'q,
    {
        at.iter().for_each(|t| T::push_values_at(t, out));
    }
    fn wrap_at<'q>(
        &self,
        p: &'q Spmd<'_, M>,
        values: &mut dyn Iterator<Item = Value>,
    ) -> Result<Self::At<'q>, CollectiveError> {
        self.iter().map(|t| t.wrap_at(p, values)).collect()
    }
}

impl<M, T: ScanXs<M>> ScanXs<M> for Vec<T> {
    type Rows<'q>
        = Vec<T::Rows<'q>>
    where
        M: 'q;
    fn push_values(&self, out: &mut Vec<Value>) {
        self.iter().for_each(|t| t.push_values(out));
    }
    fn wrap_rows<'q>(
        &self,
        p: &'q Spmd<'_, M>,
        values: &mut dyn Iterator<Item = Value>,
    ) -> Result<Self::Rows<'q>, CollectiveError> {
        self.iter().map(|t| t.wrap_rows(p, values)).collect()
    }
}

macro_rules! scan_tuples {
    ($(($($t:ident $i:tt),*);)*) => {
        $(
            impl<M, $($t: ScanCarry<M>),*> ScanCarry<M> for ($($t,)*) {
                type At<'q> = ($($t::At<'q>,)*)
    where
        M: 'q;
                #[allow(unused_variables)]
                fn push_values(&self, out: &mut Vec<Value>) {
                    $(self.$i.push_values(out);)*
                }
                #[allow(unused_variables)]
                fn push_values_at<'q>(at: &Self::At<'q>, out: &mut Vec<Value>)
    where
        M: 'q,
    {
                    $($t::push_values_at(&at.$i, out);)*
                }
                #[allow(unused_variables)]
                fn wrap_at<'q>(
                    &self,
                    p: &'q Spmd<'_, M>,
                    values: &mut dyn Iterator<Item = Value>,
                ) -> Result<Self::At<'q>, CollectiveError> {
                    Ok(($(self.$i.wrap_at(p, values)?,)*))
                }
            }

            impl<M, $($t: ScanXs<M>),*> ScanXs<M> for ($($t,)*) {
                type Rows<'q> = ($($t::Rows<'q>,)*)
    where
        M: 'q;
                #[allow(unused_variables)]
                fn push_values(&self, out: &mut Vec<Value>) {
                    $(self.$i.push_values(out);)*
                }
                #[allow(unused_variables)]
                fn wrap_rows<'q>(
                    &self,
                    p: &'q Spmd<'_, M>,
                    values: &mut dyn Iterator<Item = Value>,
                ) -> Result<Self::Rows<'q>, CollectiveError> {
                    Ok(($(self.$i.wrap_rows(p, values)?,)*))
                }
            }
        )*
    };
}

scan_tuples! {
    ();
    (A 0);
    (A 0, B 1);
    (A 0, B 1, C 2);
    (A 0, B 1, C 2, D 3);
}

impl<M: MeshShape> Spmd<'_, M> {
    /// A counted loop (JAX's `lax.scan` without per-iteration outputs): for `i` in
    /// `0..length`, `body(p, i, carry, rows)` returns the next carry. `p` is the loop body's
    /// `Spmd`, on which every typed op works (collectives, local ops, kernels, nested scans);
    /// `i` is the iteration (`i32` scalar); `carry` are the carried tensors with `init`'s
    /// layouts; `rows` is row `i` of each stacked tensor of `xs`. Returns the final carry.
    ///
    /// The body may use tensors and values of the enclosing program (the loop region is not
    /// isolated), but not add arguments or outputs. The loop is [`FuncBuilder::scan`]'s
    /// counted `stablehlo.while`, so [`Spmd::vjp`] differentiates through it (the backward
    /// re-runs the body per iteration) and the body's collectives join
    /// [`Spmd::collectives`] once, as emitted.
    ///
    /// Fails if `length` is 0, a stacked tensor's dim 0 is not `length`, or the body returns
    /// carries of other per-device types than `init`'s.
    ///
    /// [`FuncBuilder::scan`]: tessera_hlo::FuncBuilder::scan
    pub fn scan<'p, C, X, B>(
        &'p self,
        length: usize,
        init: &C,
        xs: &X,
        body: B,
    ) -> Result<C::At<'p>, CollectiveError>
    where
        C: ScanCarry<M>,
        X: ScanXs<M>,
        B: for<'q, 'r> FnOnce(
            &'q Spmd<'r, M>,
            DTensor<'q, M, (), Invariant>,
            C::At<'q>,
            X::Rows<'q>,
        ) -> Result<C::At<'q>, CollectiveError>,
    {
        let mut init_values = Vec::new();
        init.push_values(&mut init_values);
        let mut xs_values = Vec::new();
        xs.push_values(&mut xs_values);
        // Axis indices are loop-invariant: the body reads them from before the loop.
        let axis_indices = match self.axis_indices() {
            Some(v) => v,
            None => (0..self.mesh().sizes().len())
                .map(|i| self.axis_index_value(i))
                .collect::<Result<Vec<_>, _>>()?,
        };
        let out = self.ctx().build("scan", |f| {
            f.scan(
                length,
                &init_values,
                &xs_values,
                |b, i, carry, rows| -> Result<_, CollectiveError> {
                    let inner = self.loop_body(b, axis_indices.clone());
                    let i = declare(
                        inner.ctx(),
                        i,
                        TensorLayout::of::<M, (), Invariant>(),
                        "scan index",
                    )?;
                    let carry = init.wrap_at(&inner, &mut carry.iter().copied())?;
                    let rows = xs.wrap_rows(&inner, &mut rows.iter().copied())?;
                    let next = body(&inner, i, carry, rows)?;
                    let mut values = Vec::with_capacity(init_values.len());
                    C::push_values_at(&next, &mut values);
                    Ok((values, Vec::new()))
                },
            )
        })?;
        init.wrap_at(self, &mut out.carry.into_iter())
    }
}
