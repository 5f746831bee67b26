//! Ops with regions (reduce, while, if, case), calls and custom calls.

use super::{check_dims, check_scalar, FuncBuilder};
use crate::ops::{CustomCall, OpKind, Reducer, Region, Value};
use crate::{DType, HloError, TensorType};

/// What [`FuncBuilder::scan`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanOutput {
    /// The final carried values (the types of the scan's `init`).
    pub carry: Vec<Value>,
    /// The body's per-iteration outputs stacked along a new dim 0 of size `length`.
    pub ys: Vec<Value>,
}

impl FuncBuilder<'_> {
    /// Builds the body of a reduction (`reduce`, `all_reduce`, `reduce_scatter`) for one
    /// scalar type from a [`Reducer`].
    pub(super) fn reducer_region(
        &mut self,
        op: &'static str,
        reducer: Reducer,
        dtype: DType,
    ) -> Result<Region, HloError> {
        let class = reducer.op().accepts();
        if !class.contains(dtype) {
            return Err(HloError::dtype(
                op,
                format!("operand (reducer {reducer:?})"),
                dtype,
                class.describe(),
            ));
        }
        let s = TensorType::scalar(dtype);
        let (region, _) = self.region(op, "body", &[s.clone(), s], true, |b, args| {
            Ok::<_, HloError>(vec![b.binary(reducer.op(), args[0], args[1])?])
        })?;
        Ok(region)
    }

    /// Builds a reduction body from a closure and checks it yields one scalar per input of
    /// the given dtypes.
    pub(super) fn reduction_body<E, F>(
        &mut self,
        op: &'static str,
        dtypes: &[DType],
        body: F,
    ) -> Result<Region, E>
    where
        E: From<HloError>,
        F: FnOnce(&mut Self, &[Value]) -> Result<Vec<Value>, E>,
    {
        let scalars: Vec<TensorType> = dtypes.iter().map(|&d| TensorType::scalar(d)).collect();
        let arg_types: Vec<TensorType> = scalars.iter().chain(&scalars).cloned().collect();
        let (region, types) = self.region(op, "body", &arg_types, true, body)?;
        if types != scalars {
            return Err(HloError::shape(
                op,
                format!(
                    "body must return {}, returned {}",
                    list(&scalars),
                    list(&types)
                ),
            )
            .into());
        }
        Ok(region)
    }

    /// `stablehlo.reduce` of one input over `dimensions` with a standard reducer; the initial
    /// value is the reducer's identity.
    pub fn reduce(
        &mut self,
        x: Value,
        dimensions: &[i64],
        reducer: Reducer,
    ) -> Result<Value, HloError> {
        const OP: &str = "stablehlo.reduce";
        let t = self.operand(OP, 0, x)?;
        let init = reducer.identity(t.dtype).ok_or_else(|| {
            HloError::dtype(
                OP,
                format!("operand (reducer {reducer:?})"),
                t.dtype,
                reducer.op().accepts().describe(),
            )
        })?;
        check_dims(OP, "dimensions", dimensions, t.rank())?;
        let init = self.literal(init)?;
        let body = self.reducer_region(OP, reducer, t.dtype)?;
        let result = TensorType::new(kept_dims(&t.dims, dimensions), t.dtype);
        Ok(self.emit1(
            OpKind::Reduce {
                dimensions: dimensions.to_vec(),
            },
            vec![x, init],
            result,
            vec![body],
        ))
    }

    /// `stablehlo.reduce` of several inputs (same shape) with initial values (scalars of the
    /// inputs' dtypes) and a custom body. The body receives `2 * n` scalars (the accumulators,
    /// then the elements) and returns `n` scalars. It cannot capture outer values.
    pub fn reduce_with<E, F>(
        &mut self,
        inputs: &[Value],
        inits: &[Value],
        dimensions: &[i64],
        body: F,
    ) -> Result<Vec<Value>, E>
    where
        E: From<HloError>,
        F: FnOnce(&mut Self, &[Value]) -> Result<Vec<Value>, E>,
    {
        const OP: &str = "stablehlo.reduce";
        if inputs.is_empty() || inputs.len() != inits.len() {
            return Err(HloError::shape(
                OP,
                format!(
                    "needs one or more inputs and one init per input, got {} inputs and {} inits",
                    inputs.len(),
                    inits.len()
                ),
            )
            .into());
        }
        let n = inputs.len();
        let mut dtypes = Vec::with_capacity(n);
        let t0 = self.operand(OP, 0, inputs[0])?;
        for (i, &x) in inputs.iter().enumerate() {
            let t = self.operand(OP, i, x)?;
            if t.dims != t0.dims {
                return Err(
                    HloError::mismatch(OP, "inputs must have the same shape", &t, &t0).into(),
                );
            }
            let it = self.operand(OP, n + i, inits[i])?;
            check_scalar(OP, &format!("init #{i}"), &it)?;
            if it.dtype != t.dtype {
                return Err(HloError::mismatch(
                    OP,
                    format!("init #{i} dtype differs from input"),
                    &it,
                    &t,
                )
                .into());
            }
            dtypes.push(t.dtype);
        }
        check_dims(OP, "dimensions", dimensions, t0.rank())?;
        let region = self.reduction_body(OP, &dtypes, body)?;
        let kept = kept_dims(&t0.dims, dimensions);
        let results = dtypes
            .iter()
            .map(|&d| TensorType::new(kept.clone(), d))
            .collect();
        let operands = inputs.iter().chain(inits).copied().collect();
        let kind = OpKind::Reduce {
            dimensions: dimensions.to_vec(),
        };
        Ok(self.emit(kind, operands, results, vec![region]))
    }

    /// `stablehlo.while`. `cond` receives the loop-carried values and returns a scalar `i1`;
    /// `body` receives them and returns their next values (same types). Both may use values
    /// defined outside the loop. Returns the final carried values.
    pub fn while_loop<E, C, B>(&mut self, init: &[Value], cond: C, body: B) -> Result<Vec<Value>, E>
    where
        E: From<HloError>,
        C: FnOnce(&mut Self, &[Value]) -> Result<Value, E>,
        B: FnOnce(&mut Self, &[Value]) -> Result<Vec<Value>, E>,
    {
        const OP: &str = "stablehlo.while";
        if init.is_empty() {
            return Err(HloError::shape(OP, "needs at least one loop-carried value").into());
        }
        let types = init
            .iter()
            .enumerate()
            .map(|(i, &v)| self.operand(OP, i, v))
            .collect::<Result<Vec<_>, _>>()?;
        let (cond_region, cond_types) = self.region(OP, "cond", &types, false, |b, args| {
            cond(b, args).map(|c| vec![c])
        })?;
        if cond_types != [TensorType::scalar(DType::Bool)] {
            return Err(HloError::shape(
                OP,
                format!(
                    "cond must return tensor<i1>, returned {}",
                    list(&cond_types)
                ),
            )
            .into());
        }
        let (body_region, body_types) = self.region(OP, "body", &types, false, body)?;
        if body_types != types {
            return Err(HloError::shape(
                OP,
                format!(
                    "body must return the loop-carried types {}, returned {}",
                    list(&types),
                    list(&body_types)
                ),
            )
            .into());
        }
        Ok(self.emit(
            OpKind::While,
            init.to_vec(),
            types,
            vec![cond_region, body_region],
        ))
    }

    /// A counted loop `for i in lower..upper` (scalar `i32` bounds, run-time values) built on
    /// `stablehlo.while`. `body` receives `i` and the carried values and returns their next
    /// values. Returns the final carried values. With both bounds constants the loop is a
    /// counted loop, which [`FuncBuilder::vjp`] differentiates.
    pub fn fori_loop<E, B>(
        &mut self,
        lower: Value,
        upper: Value,
        init: &[Value],
        body: B,
    ) -> Result<Vec<Value>, E>
    where
        E: From<HloError>,
        B: FnOnce(&mut Self, Value, &[Value]) -> Result<Vec<Value>, E>,
    {
        const OP: &str = "stablehlo.while";
        for (i, (what, v)) in [("lower", lower), ("upper", upper)].into_iter().enumerate() {
            let t = self.operand(OP, i, v)?;
            if t != TensorType::scalar(DType::I32) {
                return Err(HloError::dtype(
                    OP,
                    format!("fori_loop {what} bound ({t})"),
                    t.dtype,
                    "a tensor<i32> scalar",
                )
                .into());
            }
        }
        let mut carried = vec![lower, upper];
        carried.extend_from_slice(init);
        let out = self.while_loop(
            &carried,
            |b, args| b.lt(args[0], args[1]).map_err(E::from),
            |b, args| -> Result<Vec<Value>, E> {
                let next = body(b, args[0], &args[2..])?;
                let one = b.scalar(1.0, DType::I32)?;
                let i1 = b.add(args[0], one)?;
                let mut all = vec![i1, args[1]];
                all.extend(next);
                Ok(all)
            },
        )?;
        Ok(out[2..].to_vec())
    }

    /// A counted loop over stacked inputs (JAX's `lax.scan`): for `i` in `0..length`,
    /// `body(f, i, carry, x_slices)` returns the next carry and this iteration's outputs `ys`.
    ///
    /// `init` are the initial carried values; every `xs` value is stacked along dim 0 (size
    /// `length`) and the body receives slice `i` of each (dim 0 dropped), read with
    /// `dynamic_slice`. The body returns `(carry, ys)`: the next carried values (the types of
    /// `init`) and any number of per-iteration values, which come back stacked as
    /// `[length, ...]`. `i` is an `i32` scalar; the body may use values defined outside.
    ///
    /// The loop is a `stablehlo.while` carrying `(i, carry..., ys buffers...)`, with the
    /// condition `i < length` (a constant) and `i + 1` as the next counter: the counted form
    /// [`FuncBuilder::vjp`] differentiates (see the autodiff module docs).
    ///
    /// ```
    /// use tessera_hlo::{DType, HloError, Module, Reducer, TensorType};
    ///
    /// // h = tanh(h + x_i) over 8 steps; every h stacked; d sum(h_final) / d x.
    /// let mut m = Module::new("scan");
    /// let mut f = m.func("main");
    /// let h0 = f.arg(TensorType::new([4], DType::F32))?;
    /// let xs = f.arg(TensorType::new([8, 4], DType::F32))?;
    /// let out = f.scan(8, &[h0], &[xs], |f, _i, carry, x| {
    ///     let s = f.add(carry[0], x[0])?;
    ///     let h = f.tanh(s)?;
    ///     Ok::<_, HloError>((vec![h], vec![h]))
    /// })?;
    /// assert_eq!(f.value_type(out.ys[0])?, &TensorType::new([8, 4], DType::F32));
    /// let loss = f.reduce(out.carry[0], &[0], Reducer::Sum)?;
    /// let dxs = f.grad(loss, &[xs])?;
    /// f.finish(&[dxs[0]])?;
    /// # Ok::<(), HloError>(())
    /// ```
    pub fn scan<E, B>(
        &mut self,
        length: usize,
        init: &[Value],
        xs: &[Value],
        body: B,
    ) -> Result<ScanOutput, E>
    where
        E: From<HloError>,
        B: FnOnce(&mut Self, Value, &[Value], &[Value]) -> Result<(Vec<Value>, Vec<Value>), E>,
    {
        const OP: &str = "stablehlo.while";
        let n = i32::try_from(length)
            .ok()
            .filter(|&n| n >= 1)
            .ok_or_else(|| {
                HloError::shape(
                    OP,
                    format!("scan length must be in 1..={}, got {length}", i32::MAX),
                )
            })?;
        let counter = TensorType::scalar(DType::I32);
        let mut types = vec![counter.clone()];
        for (i, &v) in init.iter().enumerate() {
            types.push(self.check_value(OP, &format!("scan init #{i}"), v)?);
        }
        let mut x_types = Vec::with_capacity(xs.len());
        for (i, &x) in xs.iter().enumerate() {
            let t = self.check_value(OP, &format!("scan xs #{i}"), x)?;
            if t.dims.first() != Some(&(length as i64)) {
                return Err(HloError::shape(
                    OP,
                    format!(
                        "scan xs #{i} is {t}; it must be stacked along dim 0 with size {length}"
                    ),
                )
                .into());
            }
            x_types.push(t);
        }
        let carry_types = types.clone();
        let mut ys_args = Vec::new();
        let (mut body_region, body_types) = self.region(
            OP,
            "body",
            &types,
            false,
            |b, args| -> Result<Vec<Value>, E> {
                let i = args[0];
                let mut slices = Vec::with_capacity(xs.len());
                for &x in xs {
                    slices.push(b.stacked_row(x, i)?);
                }
                let (next, ys) = body(b, i, &args[1..], &slices)?;
                let one = b.scalar(1.0, DType::I32)?;
                let mut out = vec![b.add(i, one)?];
                out.extend(next);
                let scope = b.current_scope();
                for (k, &y) in ys.iter().enumerate() {
                    let yt = b.check_value(OP, &format!("scan body ys #{k}"), y)?;
                    let buffer = b.new_value(yt.stacked(length as i64), scope);
                    ys_args.push(buffer);
                    out.push(b.set_stacked_row(buffer, i, y)?);
                }
                Ok(out)
            },
        )?;
        if body_types.len() < carry_types.len()
            || body_types[..carry_types.len()] != carry_types[..]
        {
            let returned = body_types
                .get(1..carry_types.len().min(body_types.len()))
                .unwrap_or(&[]);
            return Err(HloError::shape(
                OP,
                format!(
                    "scan body must return the carry types {}, returned {}",
                    list(&carry_types[1..]),
                    list(returned)
                ),
            )
            .into());
        }
        body_region.args.extend(ys_args);
        let (cond_region, _) = self.region(OP, "cond", &body_types, false, |b, args| {
            let end = b.scalar(f64::from(n), DType::I32)?;
            Ok::<_, HloError>(vec![b.lt(args[0], end)?])
        })?;
        let mut operands = vec![self.scalar(0.0, DType::I32)?];
        operands.extend_from_slice(init);
        for t in &body_types[carry_types.len()..] {
            operands.push(self.splat(0.0, t.clone())?);
        }
        let results = self.emit(
            OpKind::While,
            operands,
            body_types,
            vec![cond_region, body_region],
        );
        Ok(ScanOutput {
            carry: results[1..carry_types.len()].to_vec(),
            ys: results[carry_types.len()..].to_vec(),
        })
    }

    /// Row `i` (an `i32` scalar, e.g. a [`FuncBuilder::scan`] index) of `stack`, its dim 0
    /// dropped, read with `dynamic_slice`: how a scan body reads a row of a stack it does
    /// not scan over (a loop over the first rows of a longer stack, say).
    pub fn stacked_row(&mut self, stack: Value, i: Value) -> Result<Value, HloError> {
        const OP: &str = "stablehlo.dynamic_slice";
        let t = self.check_value(OP, "stacked operand", stack)?;
        if t.is_scalar() {
            return Err(HloError::shape(OP, "a scalar has no rows to read"));
        }
        let starts = self.row_starts(i, t.rank())?;
        let mut sizes = t.dims.clone();
        sizes[0] = 1;
        let row = self.dynamic_slice(stack, &starts, &sizes)?;
        self.reshape(row, &t.dims[1..])
    }

    /// `stack` with row `i` (dim 0) set to `row`, written with `dynamic_update_slice`.
    pub(crate) fn set_stacked_row(
        &mut self,
        stack: Value,
        i: Value,
        row: Value,
    ) -> Result<Value, HloError> {
        let t = self.check_value("stablehlo.dynamic_update_slice", "row", row)?;
        let row = self.reshape(row, &t.stacked(1).dims)?;
        let starts = self.row_starts(i, t.rank() + 1)?;
        self.dynamic_update_slice(stack, row, &starts)
    }

    /// Starts `[i, 0, ...]` of a row of a rank-`rank` stack.
    fn row_starts(&mut self, i: Value, rank: usize) -> Result<Vec<Value>, HloError> {
        let zero = self.scalar(0.0, DType::I32)?;
        let mut starts = vec![zero; rank];
        starts[0] = i;
        Ok(starts)
    }

    /// `stablehlo.if`: runs `then_branch` when the scalar `i1` `pred` is true, else
    /// `else_branch`. Both return values of the same types (possibly none) and may use outer
    /// values.
    pub fn if_else<E, T, F>(
        &mut self,
        pred: Value,
        then_branch: T,
        else_branch: F,
    ) -> Result<Vec<Value>, E>
    where
        E: From<HloError>,
        T: FnOnce(&mut Self) -> Result<Vec<Value>, E>,
        F: FnOnce(&mut Self) -> Result<Vec<Value>, E>,
    {
        const OP: &str = "stablehlo.if";
        let p = self.operand(OP, 0, pred)?;
        if p != TensorType::scalar(DType::Bool) {
            return Err(
                HloError::dtype(OP, format!("pred ({p})"), p.dtype, "a tensor<i1> scalar").into(),
            );
        }
        let (then_r, then_t) = self.region(OP, "then branch", &[], false, |b, _| then_branch(b))?;
        let (else_r, else_t) = self.region(OP, "else branch", &[], false, |b, _| else_branch(b))?;
        if then_t != else_t {
            return Err(HloError::shape(
                OP,
                format!(
                    "branches return different types: {} vs {}",
                    list(&then_t),
                    list(&else_t)
                ),
            )
            .into());
        }
        Ok(self.emit(OpKind::If, vec![pred], then_t, vec![then_r, else_r]))
    }

    /// `stablehlo.case`: runs branch `index` (scalar `i32`; out of range runs the last
    /// branch). `branch(b, i)` builds branch `i` of `num_branches`; all return the same types.
    pub fn case<E, F>(
        &mut self,
        index: Value,
        num_branches: usize,
        mut branch: F,
    ) -> Result<Vec<Value>, E>
    where
        E: From<HloError>,
        F: FnMut(&mut Self, usize) -> Result<Vec<Value>, E>,
    {
        const OP: &str = "stablehlo.case";
        let t = self.operand(OP, 0, index)?;
        if t != TensorType::scalar(DType::I32) {
            return Err(HloError::dtype(
                OP,
                format!("index ({t})"),
                t.dtype,
                "a tensor<i32> scalar",
            )
            .into());
        }
        if num_branches == 0 {
            return Err(HloError::shape(OP, "needs at least one branch").into());
        }
        let mut regions = Vec::with_capacity(num_branches);
        let mut types: Option<Vec<TensorType>> = None;
        for i in 0..num_branches {
            let (r, ts) =
                self.region(OP, &format!("branch #{i}"), &[], false, |b, _| branch(b, i))?;
            if let Some(t0) = &types {
                if *t0 != ts {
                    return Err(HloError::shape(
                        OP,
                        format!(
                            "branch #{i} returns {}, branch #0 returns {}",
                            list(&ts),
                            list(t0)
                        ),
                    )
                    .into());
                }
            }
            types.get_or_insert(ts);
            regions.push(r);
        }
        Ok(self.emit(
            OpKind::Case,
            vec![index],
            types.unwrap_or_default(),
            regions,
        ))
    }

    /// `func.call` of a function already finished in this module.
    pub fn call(&mut self, callee: &str, args: &[Value]) -> Result<Vec<Value>, HloError> {
        const OP: &str = "func.call";
        let func = self.module.get_func(callee).ok_or_else(|| HloError::Func {
            func: callee.to_string(),
            reason: "func.call: no such function in the module (finish it before calling it)"
                .into(),
        })?;
        let params = func.arg_types();
        let results = func.result_types();
        if params.len() != args.len() {
            return Err(HloError::shape(
                OP,
                format!(
                    "@{callee} takes {} arguments, got {}",
                    params.len(),
                    args.len()
                ),
            ));
        }
        for (i, (&a, p)) in args.iter().zip(&params).enumerate() {
            let t = self.operand(OP, i, a)?;
            if t != *p {
                return Err(HloError::mismatch(
                    OP,
                    format!("argument #{i} of @{callee}"),
                    &t,
                    p,
                ));
            }
        }
        let kind = OpKind::Call {
            callee: callee.to_string(),
        };
        Ok(self.emit(kind, args.to_vec(), results, vec![]))
    }

    /// `stablehlo.custom_call` to `spec.call_target_name` with the given result types. Layouts, when
    /// given, are minor-to-major permutations, one per operand / result.
    pub fn custom_call(
        &mut self,
        spec: CustomCall,
        operands: &[Value],
        result_types: &[TensorType],
    ) -> Result<Vec<Value>, HloError> {
        const OP: &str = "stablehlo.custom_call";
        if spec.call_target_name.is_empty() {
            return Err(HloError::attr(OP, "call_target_name", "must not be empty"));
        }
        if spec.sharding.is_some() && !self.module.mesh().is_empty() {
            return Err(HloError::attr(
                OP,
                "mhlo.sharding",
                "is GSPMD's form, not allowed on a module with a mesh (Shardy's form)",
            ));
        }
        let types = operands
            .iter()
            .enumerate()
            .map(|(i, &v)| self.operand(OP, i, v))
            .collect::<Result<Vec<_>, _>>()?;
        for (i, t) in result_types.iter().enumerate() {
            t.validate(OP, &format!("result #{i}"))?;
        }
        check_layouts(
            OP,
            "operand_layouts",
            spec.operand_layouts.as_deref(),
            &types,
        )?;
        check_layouts(
            OP,
            "result_layouts",
            spec.result_layouts.as_deref(),
            result_types,
        )?;
        for a in &spec.output_operand_aliases {
            let (Some(o), Some(r)) = (types.get(a.operand), result_types.get(a.output)) else {
                return Err(HloError::attr(
                    OP,
                    "output_operand_aliases",
                    format!("result {} / operand {} out of range", a.output, a.operand),
                ));
            };
            if o != r {
                return Err(HloError::mismatch(
                    OP,
                    "aliased operand and result types differ",
                    o,
                    r,
                ));
            }
        }
        for (name, _) in &spec.extra_attrs {
            let ok = !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '$');
            if !ok {
                return Err(HloError::attr(
                    OP,
                    "extra_attrs",
                    format!("invalid attribute name {name:?}"),
                ));
            }
        }
        Ok(self.emit(
            OpKind::CustomCall(spec),
            operands.to_vec(),
            result_types.to_vec(),
            vec![],
        ))
    }
}

/// `dims` without the `removed` dimensions.
fn kept_dims(dims: &[i64], removed: &[i64]) -> Vec<i64> {
    dims.iter()
        .enumerate()
        .filter(|(i, _)| !removed.contains(&(*i as i64)))
        .map(|(_, &d)| d)
        .collect()
}

fn check_layouts(
    op: &'static str,
    attr: &'static str,
    layouts: Option<&[Vec<i64>]>,
    types: &[TensorType],
) -> Result<(), HloError> {
    let Some(layouts) = layouts else {
        return Ok(());
    };
    if layouts.len() != types.len() {
        return Err(HloError::attr(
            op,
            attr,
            format!("{} layouts for {} values", layouts.len(), types.len()),
        ));
    }
    for (i, (l, t)) in layouts.iter().zip(types).enumerate() {
        if l.len() != t.rank() {
            return Err(HloError::attr(
                op,
                attr,
                format!("layout #{i} {l:?} has the wrong length for {t}"),
            ));
        }
        check_dims(op, attr, l, t.rank())?;
    }
    Ok(())
}

/// `(tensor<f32>, tensor<i32>)` for messages.
fn list(types: &[TensorType]) -> String {
    let inner: Vec<String> = types.iter().map(|t| t.to_string()).collect();
    format!("({})", inner.join(", "))
}
