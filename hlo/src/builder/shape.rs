//! Shape ops (broadcast, reshape, transpose, slices, concatenate, pad) and dot_general.

use super::{check_dim, check_dims, check_len, check_scalar, FuncBuilder};
use crate::ops::{DotDims, OpKind, Precision, Value};
use crate::{DType, HloError, Reducer, TensorType};

impl FuncBuilder<'_> {
    /// `stablehlo.broadcast_in_dim`: operand dimension `i` becomes result dimension
    /// `broadcast_dimensions[i]`; its size must be 1 or the result size there.
    pub fn broadcast_in_dim(
        &mut self,
        x: Value,
        dims: &[i64],
        broadcast_dimensions: &[i64],
    ) -> Result<Value, HloError> {
        const OP: &str = "stablehlo.broadcast_in_dim";
        let t = self.operand(OP, 0, x)?;
        let result = TensorType::new(dims.to_vec(), t.dtype);
        result.validate(OP, "result shape")?;
        check_len(OP, "broadcast_dimensions", broadcast_dimensions, t.rank())?;
        check_dims(
            OP,
            "broadcast_dimensions",
            broadcast_dimensions,
            result.rank(),
        )?;
        for (i, (&size, &d)) in t.dims.iter().zip(broadcast_dimensions).enumerate() {
            let target = dims[d as usize];
            if size != 1 && size != target {
                return Err(HloError::shape(
                    OP,
                    format!(
                        "operand dimension {i} has size {size}, result dimension {d} has size \
                         {target} (operand {t}, result {result})"
                    ),
                ));
            }
        }
        let kind = OpKind::BroadcastInDim {
            broadcast_dimensions: broadcast_dimensions.to_vec(),
        };
        Ok(self.emit1(kind, vec![x], result, vec![]))
    }

    /// NumPy-style broadcast to `dims`: operand dimensions align with the trailing result
    /// dimensions (a scalar broadcasts to anything).
    pub fn broadcast(&mut self, x: Value, dims: &[i64]) -> Result<Value, HloError> {
        let rank = self.operand("stablehlo.broadcast_in_dim", 0, x)?.rank();
        if rank > dims.len() {
            return Err(HloError::shape(
                "stablehlo.broadcast_in_dim",
                format!(
                    "cannot broadcast rank {rank} to rank {} ({dims:?})",
                    dims.len()
                ),
            ));
        }
        let offset = (dims.len() - rank) as i64;
        let bd: Vec<i64> = (0..rank as i64).map(|i| i + offset).collect();
        self.broadcast_in_dim(x, dims, &bd)
    }

    /// `stablehlo.reshape` to `dims` (same element count).
    pub fn reshape(&mut self, x: Value, dims: &[i64]) -> Result<Value, HloError> {
        const OP: &str = "stablehlo.reshape";
        let t = self.operand(OP, 0, x)?;
        let result = TensorType::new(dims.to_vec(), t.dtype);
        result.validate(OP, "result shape")?;
        if result.num_elements() != t.num_elements() {
            return Err(HloError::shape(
                OP,
                format!("element count differs: operand {t}, result {result}"),
            ));
        }
        Ok(self.emit1(OpKind::Reshape, vec![x], result, vec![]))
    }

    /// `stablehlo.optimization_barrier` of one value: the value unchanged, computed in the
    /// form it was built in (XLA neither folds the ops that produce it into the ops that use
    /// it nor the other way round).
    pub fn optimization_barrier(&mut self, x: Value) -> Result<Value, HloError> {
        Ok(self.optimization_barrier_all(&[x])?[0])
    }

    /// `stablehlo.optimization_barrier` of several values: each unchanged, and none available
    /// to later ops before all are computed. Orders a schedule: what reads a result waits for
    /// every operand (e.g. a ring's next transfer waits for the current step's compute).
    pub fn optimization_barrier_all(&mut self, xs: &[Value]) -> Result<Vec<Value>, HloError> {
        const OP: &str = "stablehlo.optimization_barrier";
        if xs.is_empty() {
            return Err(HloError::shape(OP, "it needs at least one operand"));
        }
        let types = xs
            .iter()
            .enumerate()
            .map(|(i, &x)| Ok(self.operand(OP, i, x)?.clone()))
            .collect::<Result<Vec<_>, HloError>>()?;
        Ok(self.emit(OpKind::OptimizationBarrier, xs.to_vec(), types, vec![]))
    }

    /// `stablehlo.transpose`: result dimension `i` is operand dimension `permutation[i]`.
    pub fn transpose(&mut self, x: Value, permutation: &[i64]) -> Result<Value, HloError> {
        const OP: &str = "stablehlo.transpose";
        let t = self.operand(OP, 0, x)?;
        check_len(OP, "permutation", permutation, t.rank())?;
        check_dims(OP, "permutation", permutation, t.rank())?;
        let dims: Vec<i64> = permutation.iter().map(|&p| t.dims[p as usize]).collect();
        let kind = OpKind::Transpose {
            permutation: permutation.to_vec(),
        };
        Ok(self.emit1(kind, vec![x], TensorType::new(dims, t.dtype), vec![]))
    }

    /// `stablehlo.reverse` along `dimensions`.
    pub fn reverse(&mut self, x: Value, dimensions: &[i64]) -> Result<Value, HloError> {
        const OP: &str = "stablehlo.reverse";
        let t = self.operand(OP, 0, x)?;
        check_dims(OP, "dimensions", dimensions, t.rank())?;
        let kind = OpKind::Reverse {
            dimensions: dimensions.to_vec(),
        };
        Ok(self.emit1(kind, vec![x], t, vec![]))
    }

    /// `stablehlo.slice` with unit strides: `[start, limit)` per dimension.
    pub fn slice(&mut self, x: Value, start: &[i64], limit: &[i64]) -> Result<Value, HloError> {
        let strides = vec![1; start.len()];
        self.slice_strided(x, start, limit, &strides)
    }

    /// `stablehlo.slice`: `0 <= start <= limit <= size`, `stride >= 1`; the result size is
    /// `ceil((limit - start) / stride)`.
    pub fn slice_strided(
        &mut self,
        x: Value,
        start: &[i64],
        limit: &[i64],
        strides: &[i64],
    ) -> Result<Value, HloError> {
        const OP: &str = "stablehlo.slice";
        let t = self.operand(OP, 0, x)?;
        check_len(OP, "start_indices", start, t.rank())?;
        check_len(OP, "limit_indices", limit, t.rank())?;
        check_len(OP, "strides", strides, t.rank())?;
        let mut dims = Vec::with_capacity(t.rank());
        for i in 0..t.rank() {
            let (s, l, st, size) = (start[i], limit[i], strides[i], t.dims[i]);
            if !(0 <= s && s <= l && l <= size) {
                return Err(HloError::attr(
                    OP,
                    "start_indices/limit_indices",
                    format!("dimension {i}: need 0 <= start {s} <= limit {l} <= size {size}"),
                ));
            }
            if st < 1 {
                return Err(HloError::attr(
                    OP,
                    "strides",
                    format!("dimension {i}: stride {st} < 1"),
                ));
            }
            dims.push(if l == s { 0 } else { (l - s - 1) / st + 1 });
        }
        let kind = OpKind::Slice {
            start_indices: start.to_vec(),
            limit_indices: limit.to_vec(),
            strides: strides.to_vec(),
        };
        Ok(self.emit1(kind, vec![x], TensorType::new(dims, t.dtype), vec![]))
    }

    /// Checks dynamic start indices: one integer scalar per dimension, all of one dtype.
    fn check_starts(
        &self,
        op: &'static str,
        first_index: usize,
        starts: &[Value],
        rank: usize,
    ) -> Result<(), HloError> {
        if starts.len() != rank {
            return Err(HloError::shape(
                op,
                format!(
                    "needs {rank} start indices (one per dimension), got {}",
                    starts.len()
                ),
            ));
        }
        let mut dtype = None;
        for (i, &s) in starts.iter().enumerate() {
            let st = self.operand(op, first_index + i, s)?;
            check_scalar(op, &format!("start index #{i}"), &st)?;
            if !st.dtype.is_int() {
                return Err(HloError::dtype(
                    op,
                    format!("start index #{i}"),
                    st.dtype,
                    "i32 or i8",
                ));
            }
            if dtype.is_some_and(|d| d != st.dtype) {
                return Err(HloError::dtype(
                    op,
                    format!("start index #{i}"),
                    st.dtype,
                    "the dtype of the other start indices",
                ));
            }
            dtype = Some(st.dtype);
        }
        Ok(())
    }

    /// `stablehlo.dynamic_slice`: a `slice_sizes` window at run-time offsets `starts` (one
    /// integer scalar per dimension; clamped into range at run time).
    pub fn dynamic_slice(
        &mut self,
        x: Value,
        starts: &[Value],
        slice_sizes: &[i64],
    ) -> Result<Value, HloError> {
        const OP: &str = "stablehlo.dynamic_slice";
        let t = self.operand(OP, 0, x)?;
        self.check_starts(OP, 1, starts, t.rank())?;
        check_len(OP, "slice_sizes", slice_sizes, t.rank())?;
        for (i, (&s, &size)) in slice_sizes.iter().zip(&t.dims).enumerate() {
            if !(0..=size).contains(&s) {
                return Err(HloError::attr(
                    OP,
                    "slice_sizes",
                    format!("dimension {i}: size {s} not in 0..={size}"),
                ));
            }
        }
        let mut operands = vec![x];
        operands.extend_from_slice(starts);
        let kind = OpKind::DynamicSlice {
            slice_sizes: slice_sizes.to_vec(),
        };
        Ok(self.emit1(
            kind,
            operands,
            TensorType::new(slice_sizes.to_vec(), t.dtype),
            vec![],
        ))
    }

    /// `stablehlo.gather` of whole rows: row `i` of the result is row `indices[i]` of `x`
    /// (`[V, ...]`; `indices` `[N]` i32, clamped into `0..V`), so the result is `[N, ...]`
    /// (JAX's `jnp.take(x, indices, axis=0)`, an embedding lookup).
    pub fn gather_rows(&mut self, x: Value, indices: Value) -> Result<Value, HloError> {
        const OP: &str = "stablehlo.gather";
        let t = self.operand(OP, 0, x)?;
        let n = self.row_indices(OP, 1, indices)?;
        if t.rank() == 0 {
            return Err(HloError::shape(
                OP,
                "the operand is a scalar; it has no rows",
            ));
        }
        let row_dims = t.dims[1..].to_vec();
        let mut dims = vec![n];
        dims.extend_from_slice(&row_dims);
        Ok(self.emit1(
            OpKind::GatherRows { row_dims },
            vec![x, indices],
            TensorType::new(dims, t.dtype),
            vec![],
        ))
    }

    /// `stablehlo.scatter` of whole rows, adding: `x` (`[V, ...]`) with row `i` of `updates`
    /// (`[N, ...]`) added to row `indices[i]` (`[N]` i32; repeated indices add up, an index
    /// outside `0..V` is skipped). The transpose of [`FuncBuilder::gather_rows`].
    pub fn scatter_add_rows(
        &mut self,
        x: Value,
        indices: Value,
        updates: Value,
    ) -> Result<Value, HloError> {
        const OP: &str = "stablehlo.scatter";
        let t = self.operand(OP, 0, x)?;
        let n = self.row_indices(OP, 1, indices)?;
        let u = self.operand(OP, 2, updates)?;
        if t.rank() == 0
            || u.dtype != t.dtype
            || u.rank() != t.rank()
            || u.dims[0] != n
            || u.dims[1..] != t.dims[1..]
        {
            return Err(HloError::mismatch(
                OP,
                format!(
                    "updates must be {n} rows of the operand's rows (same dtype), one per index"
                ),
                &t,
                &u,
            ));
        }
        let body = self.reducer_region(OP, Reducer::Sum, t.dtype)?;
        Ok(self.emit1(
            OpKind::ScatterAddRows {
                row_dims: t.dims[1..].to_vec(),
            },
            vec![x, indices, updates],
            t,
            vec![body],
        ))
    }

    /// Checks that operand `index` of `op` is `[N]` i32 row indices; returns `N`.
    fn row_indices(&self, op: &'static str, index: usize, indices: Value) -> Result<i64, HloError> {
        let it = self.operand(op, index, indices)?;
        if it.dtype != DType::I32 {
            return Err(HloError::dtype(op, "indices", it.dtype, "i32"));
        }
        match it.dims[..] {
            [n] => Ok(n),
            _ => Err(HloError::shape(
                op,
                format!("the indices must be one row index each, [N], got {it}"),
            )),
        }
    }

    /// `stablehlo.dynamic_update_slice`: `x` with `update` written at run-time offsets
    /// `starts` (clamped so the update fits).
    pub fn dynamic_update_slice(
        &mut self,
        x: Value,
        update: Value,
        starts: &[Value],
    ) -> Result<Value, HloError> {
        const OP: &str = "stablehlo.dynamic_update_slice";
        let t = self.operand(OP, 0, x)?;
        let u = self.operand(OP, 1, update)?;
        if u.dtype != t.dtype
            || u.rank() != t.rank()
            || u.dims.iter().zip(&t.dims).any(|(a, b)| a > b)
        {
            return Err(HloError::mismatch(
                OP,
                "update must have the operand's dtype and rank and fit inside it",
                &u,
                &t,
            ));
        }
        self.check_starts(OP, 2, starts, t.rank())?;
        let mut operands = vec![x, update];
        operands.extend_from_slice(starts);
        Ok(self.emit1(OpKind::DynamicUpdateSlice, operands, t, vec![]))
    }

    /// `stablehlo.concatenate` along `dimension`; the other dimensions and dtypes agree.
    pub fn concatenate(&mut self, xs: &[Value], dimension: i64) -> Result<Value, HloError> {
        const OP: &str = "stablehlo.concatenate";
        let Some(&first) = xs.first() else {
            return Err(HloError::shape(OP, "needs at least one operand"));
        };
        let t0 = self.operand(OP, 0, first)?;
        let d = check_dim(OP, "dimension", dimension, t0.rank())?;
        let mut dims = t0.dims.clone();
        dims[d] = 0;
        for (i, &x) in xs.iter().enumerate() {
            let t = self.operand(OP, i, x)?;
            let same_elsewhere = t.rank() == t0.rank()
                && t.dims
                    .iter()
                    .zip(&t0.dims)
                    .enumerate()
                    .all(|(j, (a, b))| j == d || a == b);
            if t.dtype != t0.dtype || !same_elsewhere {
                return Err(HloError::mismatch(
                    OP,
                    format!("operand #{i} must match operand #0 except in dimension {d}"),
                    &t,
                    &t0,
                ));
            }
            dims[d] = dims[d].checked_add(t.dims[d]).ok_or_else(|| {
                HloError::shape(OP, format!("concatenated dimension {d} overflows"))
            })?;
        }
        let kind = OpKind::Concatenate { dimension };
        Ok(self.emit1(kind, xs.to_vec(), TensorType::new(dims, t0.dtype), vec![]))
    }

    /// `stablehlo.pad`: `low`/`high` edge padding (negative values crop) and non-negative
    /// `interior` padding between elements, filled with the scalar `padding_value`.
    pub fn pad(
        &mut self,
        x: Value,
        padding_value: Value,
        low: &[i64],
        high: &[i64],
        interior: &[i64],
    ) -> Result<Value, HloError> {
        const OP: &str = "stablehlo.pad";
        let t = self.operand(OP, 0, x)?;
        let p = self.operand(OP, 1, padding_value)?;
        check_scalar(OP, "padding_value", &p)?;
        if p.dtype != t.dtype {
            return Err(HloError::mismatch(
                OP,
                "padding_value dtype differs",
                &p,
                &t,
            ));
        }
        check_len(OP, "edge_padding_low", low, t.rank())?;
        check_len(OP, "edge_padding_high", high, t.rank())?;
        check_len(OP, "interior_padding", interior, t.rank())?;
        let mut dims = Vec::with_capacity(t.rank());
        for i in 0..t.rank() {
            let size = t.dims[i];
            if interior[i] < 0 {
                return Err(HloError::attr(
                    OP,
                    "interior_padding",
                    format!("dimension {i}: {} < 0", interior[i]),
                ));
            }
            let inner = (size - 1).max(0).checked_mul(interior[i]);
            let d = inner
                .and_then(|n| n.checked_add(size))
                .and_then(|n| n.checked_add(low[i]))
                .and_then(|n| n.checked_add(high[i]));
            match d {
                Some(d) if d >= 0 => dims.push(d),
                _ => {
                    return Err(HloError::shape(
                        OP,
                        format!("dimension {i}: padded size is negative or overflows"),
                    ))
                }
            }
        }
        let kind = OpKind::Pad {
            low: low.to_vec(),
            high: high.to_vec(),
            interior: interior.to_vec(),
        };
        Ok(self.emit1(
            kind,
            vec![x, padding_value],
            TensorType::new(dims, t.dtype),
            vec![],
        ))
    }

    /// `stablehlo.dot_general`. The result has the batch dimensions, then the free lhs
    /// dimensions, then the free rhs dimensions; its element type is `result_dtype` (the
    /// accumulation type: e.g. bf16 x bf16 -> f32, i8 x i8 -> i32).
    pub fn dot_general(
        &mut self,
        lhs: Value,
        rhs: Value,
        dims: &DotDims,
        result_dtype: DType,
        precision: Option<[Precision; 2]>,
    ) -> Result<Value, HloError> {
        const OP: &str = "stablehlo.dot_general";
        let l = self.operand(OP, 0, lhs)?;
        let r = self.operand(OP, 1, rhs)?;
        if l.dtype != r.dtype {
            return Err(HloError::mismatch(OP, "lhs and rhs dtypes differ", &l, &r));
        }
        let ok_result = if l.dtype.is_float() {
            result_dtype.is_float()
        } else if l.dtype.is_int() {
            result_dtype.is_int()
        } else {
            false
        };
        if l.dtype.is_bool() {
            return Err(HloError::dtype(
                OP,
                "lhs",
                l.dtype,
                "a float or integer type",
            ));
        }
        if !ok_result {
            return Err(HloError::dtype(
                OP,
                "result",
                result_dtype,
                format!(
                    "a {} result type for {} operands",
                    if l.dtype.is_float() {
                        "float"
                    } else {
                        "integer"
                    },
                    l.dtype
                ),
            ));
        }
        let DotDims {
            lhs_batch,
            rhs_batch,
            lhs_contracting,
            rhs_contracting,
        } = dims;
        if lhs_batch.len() != rhs_batch.len() {
            return Err(HloError::attr(
                OP,
                "dot_dimension_numbers",
                format!(
                    "lhs has {} batch dimensions, rhs {}",
                    lhs_batch.len(),
                    rhs_batch.len()
                ),
            ));
        }
        if lhs_contracting.len() != rhs_contracting.len() {
            return Err(HloError::attr(
                OP,
                "dot_dimension_numbers",
                format!(
                    "lhs has {} contracting dimensions, rhs {}",
                    lhs_contracting.len(),
                    rhs_contracting.len()
                ),
            ));
        }
        let lhs_all: Vec<i64> = lhs_batch.iter().chain(lhs_contracting).copied().collect();
        let rhs_all: Vec<i64> = rhs_batch.iter().chain(rhs_contracting).copied().collect();
        check_dims(OP, "dot_dimension_numbers (lhs)", &lhs_all, l.rank())?;
        check_dims(OP, "dot_dimension_numbers (rhs)", &rhs_all, r.rank())?;
        for (kind, ls, rs) in [
            ("batch", lhs_batch, rhs_batch),
            ("contracting", lhs_contracting, rhs_contracting),
        ] {
            for (&a, &b) in ls.iter().zip(rs) {
                let (sa, sb) = (l.dims[a as usize], r.dims[b as usize]);
                if sa != sb {
                    return Err(HloError::shape(
                        OP,
                        format!(
                            "{kind} dimension sizes differ: lhs dim {a} = {sa}, rhs dim {b} = {sb} \
                             (lhs {l}, rhs {r})"
                        ),
                    ));
                }
            }
        }
        let mut out: Vec<i64> = lhs_batch.iter().map(|&d| l.dims[d as usize]).collect();
        out.extend(
            (0..l.rank() as i64)
                .filter(|d| !lhs_all.contains(d))
                .map(|d| l.dims[d as usize]),
        );
        out.extend(
            (0..r.rank() as i64)
                .filter(|d| !rhs_all.contains(d))
                .map(|d| r.dims[d as usize]),
        );
        let kind = OpKind::DotGeneral {
            dims: dims.clone(),
            precision,
        };
        Ok(self.emit1(
            kind,
            vec![lhs, rhs],
            TensorType::new(out, result_dtype),
            vec![],
        ))
    }

    /// Batched matrix product `[..., m, k] x [..., k, n] -> [..., m, n]` (equal ranks >= 2,
    /// leading dimensions are batch dimensions), accumulating in `result_dtype`.
    pub fn matmul(
        &mut self,
        lhs: Value,
        rhs: Value,
        result_dtype: DType,
    ) -> Result<Value, HloError> {
        const OP: &str = "stablehlo.dot_general";
        let l = self.operand(OP, 0, lhs)?;
        let r = self.operand(OP, 1, rhs)?;
        if l.rank() < 2 || l.rank() != r.rank() {
            return Err(HloError::mismatch(
                OP,
                "matmul needs operands of equal rank >= 2",
                &l,
                &r,
            ));
        }
        let n = l.rank() as i64;
        let batch: Vec<i64> = (0..n - 2).collect();
        let dims = DotDims::new(batch.clone(), batch, [n - 1], [n - 2]);
        self.dot_general(lhs, rhs, &dims, result_dtype, None)
    }
}
