//! The forward pass on one device: embedding, the decoder layers as one loop over the
//! stacked weights (attention through [`AttentionLayer`], SwiGLU MLP), the LM head and the
//! summed cross-entropy.

use super::*;

/// This device's token rows `[b * s, d]` of the residual stream: its batch block over `data`,
/// its sequence block over `context` (and `ring`, which one dim cannot say). A layer's
/// input and output.
pub(super) type TokenRows = (Split<Data>, Replicated);

/// Every layer's stacked norm vectors and matrices (laid out as `W`), or the every-`k`th
/// layers of them that one position of a `k`-layer iteration reads.
type StackedGroup<'p, W> = (
    Vec<DTensor<'p, ModelMesh, StackedVector>>,
    Vec<DTensor<'p, ModelMesh, W>>,
);

/// One layer's rows of the stacked norm vectors and matrices (laid out as `W`), as one
/// iteration of the layer loop reads them.
type LayerRows<'p, W> = (
    Vec<DTensor<'p, ModelMesh, <StackedVector as Unstack<ModelMesh>>::Row>>,
    Vec<DTensor<'p, ModelMesh, <W as Unstack<ModelMesh>>::Row>>,
);

/// Row `i` (an `i32` scalar) of each stack of `groups` (one group per layer of an iteration),
/// read on `p`.
fn layer_rows<'q, W: StackedWeights>(
    p: &'q Spmd<'_, ModelMesh>,
    groups: &[StackedGroup<'_, W>],
    i: Value,
) -> Result<Vec<LayerRows<'q, W>>, CollectiveError> {
    groups
        .iter()
        .map(|(vectors, matrices)| {
            Ok((
                vectors
                    .iter()
                    .map(|t| layer_row_at(p, t, i))
                    .collect::<Result<Vec<_>, _>>()?,
                matrices
                    .iter()
                    .map(|t| layer_row_at(p, t, i))
                    .collect::<Result<Vec<_>, _>>()?,
            ))
        })
        .collect()
}

/// The model's values in one program.
pub(super) struct Model<'a> {
    pub(super) m: &'a ModelConfig,
    pub(super) layer: &'a AttentionLayer,
    pub(super) embed: Value,
    /// Every layer's parameters stacked `[L, ...]`.
    pub(super) layers: LayerParams,
    pub(super) final_norm: Value,
    pub(super) lm_head: Value,
    /// Sequences and tokens per sequence on each device.
    pub(super) b: i64,
    pub(super) s: i64,
    /// How the weights are split, and so gathered before use.
    pub(super) weights: WeightSplit,
    /// The compute dtype of the matmuls and the attention ([`TrainConfig::dtype`]).
    pub(super) dtype: DType,
    /// [`TrainConfig::layers_per_iteration`].
    pub(super) layers_per_iteration: usize,
    /// Whether the backward re-runs the layer loop's last iteration too
    /// ([`TrainConfig::remat_last_layer`]); forward-only programs run every iteration in
    /// the loop.
    pub(super) remat_last_layer: bool,
    /// With [`TrainConfig::collective_matmul`], the kernels' lowering: the layers' weight
    /// matmuls run the all-gather matmul.
    pub(super) collective_matmul: Option<&'a Lowering>,
    /// With [`TrainConfig::segment_ids`]: the `[b, S]` segment ids (whole rows, natural
    /// order) the attention keeps documents apart with; the loss then leaves out the
    /// positions whose target is -1.
    pub(super) segments: Option<Value>,
    /// Instead of the loss, the logits `[vocab]` summed over this device's positions whose
    /// target is not -1 (sampling marks the one position it reads).
    pub(super) logits: bool,
    /// With [`RematPolicy::SaveAttention`]: the attention's output is kept for the layer
    /// loop's backward (its kernels keep their residuals: the layer's `ContextParallel`
    /// options).
    pub(super) keep_attention: bool,
}

impl<'a> Model<'a> {
    pub(super) fn new(
        m: &'a ModelConfig,
        params: &[Value],
        cfg: &'a TrainConfig,
        layer: &'a AttentionLayer,
    ) -> Self {
        let layers = LayerParams::from_slice(&params[1..1 + PER_LAYER]);
        let cp = cfg.ici_context_parallelism;
        Model {
            m,
            layer,
            embed: params[0],
            layers,
            final_norm: params[params.len() - 2],
            lm_head: params[params.len() - 1],
            b: cfg.sequences_per_shard() as i64,
            s: (cfg.max_target_length / cp) as i64,
            weights: WeightSplit::of(cfg),
            dtype: cfg.dtype,
            layers_per_iteration: cfg.layers_per_iteration,
            remat_last_layer: cfg.remat_last_layer,
            collective_matmul: (cfg.fsdp() && cfg.collective_matmul).then_some(&cfg.lowering),
            segments: None,
            logits: false,
            keep_attention: cfg.remat_policy == RematPolicy::SaveAttention,
        }
    }

    /// The embedding `[vocab, d]` and LM head `[d, vocab]` whole, in the compute dtype, from
    /// their shards: the model dim split over `R` (the batch or the ring axis), the vocab
    /// over `context`; cast before the gathers, so they move `dtype` bytes.
    fn gathered_embeddings<R>(
        &self,
        p: &Spmd<'_, ModelMesh>,
    ) -> Result<(Value, Value), CollectiveError>
    where
        R: tessera_collectives::MeshAxis,
        ModelMesh: tessera_collectives::HasAxis<R>,
    {
        let embed = p.declare::<(Split<Context>, Split<R>), Invariant>(self.embed)?;
        let lm_head = p.declare::<(Split<R>, Split<Context>), Invariant>(self.lm_head)?;
        let embed = in_dtype(&embed, self.dtype)?
            .all_gather::<R, 1>()?
            .all_gather::<Context, 0>()?;
        Ok((embed.value(), gathered::<R>(&lm_head, self.dtype)?))
    }

    /// The cross-entropy summed over this device's tokens (f32 scalar), from each device's
    /// `[tokens, targets, positions]` (with [`Model::logits`], the logits of its marked
    /// positions instead).
    pub(super) fn forward<'p>(
        &self,
        p: &'p Spmd<'_, ModelMesh>,
        ids: &[DTensor<'p, ModelMesh, TokenLayout>; 3],
    ) -> Result<Value, CollectiveError> {
        let m = self.m;
        let n = self.b * self.s;
        let dtype = self.dtype;
        let (embed, lm_head) = match self.weights {
            WeightSplit::Batch => self.gathered_embeddings::<Data>(p)?,
            WeightSplit::Ring => self.gathered_embeddings::<RingAxis>(p)?,
            WeightSplit::Replicated => {
                let embed = p.declare::<(Replicated, Replicated), Invariant>(self.embed)?;
                let lm_head = p.declare::<(Replicated, Replicated), Invariant>(self.lm_head)?;
                (
                    in_dtype(&embed, dtype)?.value(),
                    in_dtype(&lm_head, dtype)?.value(),
                )
            }
        };
        // Each device's tokens as rows: the embedding's rows of the tokens, the targets
        // one-hot, and the RoPE tables at the tokens' global positions.
        let [tokens, targets, positions] = ids;
        let flat = |f: &mut FuncBuilder<'_>, v| f.reshape(v, &[n]);
        let x0 = tokens.map_local_as::<TokenRows, Invariant>(|f, t| {
            let t = flat(f, t)?;
            // Gathered from the table in f32, so that the backward's scatter adds the rows
            // of repeated tokens in f32 (the table arrives in the compute dtype).
            let table = cast(f, embed, DType::F32)?;
            let rows = f.gather_rows(table, t)?;
            cast(f, rows, dtype)
        })?;
        let target_onehot = targets.map_local_as::<TokenRows, Invariant>(|f, t| {
            let t = flat(f, t)?;
            one_hot(f, t, m.vocab)
        })?;
        let mask = match self.segments {
            Some(_) => Some(
                targets
                    .map_local_as::<TokenRows, Invariant>(|f, t| {
                        let mask = target_mask(f, t)?;
                        Ok(f.reshape(mask, &[n, 1])?)
                    })?
                    .value(),
            ),
            None => None,
        };
        // One local op per table (a typed tensor holds one value); XLA merges their common
        // work.
        let rope_table = |sine: bool| {
            positions.map_local_as::<TokenRows, Invariant>(|f, pos| {
                let pos = flat(f, pos)?;
                let (cos, sin) = rope_tables(f, pos, m.head_dim, m.rope_theta)?;
                cast(f, if sine { sin } else { cos }, dtype)
            })
        };
        let (cos, sin) = (rope_table(false)?.value(), rope_table(true)?.value());
        let x = match self.weights {
            WeightSplit::Batch => self.layers::<FsdpStackedMatrix>(p, &x0, cos, sin)?,
            WeightSplit::Ring => self.layers::<RingStackedMatrix>(p, &x0, cos, sin)?,
            WeightSplit::Replicated => self.layers::<StackedMatrix>(p, &x0, cos, sin)?,
        };
        let target_onehot = target_onehot.value();
        if self.logits {
            let mask = mask.ok_or_else(|| {
                CollectiveError::local("the logits of a position need text's targets")
            })?;
            let picked = x.map_local_as::<(Replicated,), Invariant>(|f, x| {
                let x = cast(f, x, DType::F32)?;
                let (h, _) = rms_norm(f, x, self.final_norm, m.norm_eps)?;
                let h = cast(f, h, dtype)?;
                let logits = f.matmul(h, lm_head, DType::F32)?;
                let mask = f.reshape(mask, &[n])?;
                let mask = bcast(f, mask, &[n, m.vocab as i64], &[0])?;
                let picked = f.mul(logits, mask)?;
                Ok(f.reduce(picked, &[0], Reducer::Sum)?)
            })?;
            return Ok(picked.value());
        }
        let loss = x.map_local_as::<(), Invariant>(|f, x| {
            let x = cast(f, x, DType::F32)?;
            let (h, _) = rms_norm(f, x, self.final_norm, m.norm_eps)?;
            let h = cast(f, h, dtype)?;
            let logits = f.matmul(h, lm_head, DType::F32)?;
            let lse = logsumexp(f, logits)?;
            let picked = f.mul(logits, target_onehot)?;
            let picked = f.reduce(picked, &[1], Reducer::Sum)?;
            let mut per_token = f.sub(lse, picked)?;
            if let Some(mask) = mask {
                let mask = f.reshape(mask, &[n])?;
                per_token = f.mul(per_token, mask)?;
            }
            Ok(f.reduce(per_token, &[0], Reducer::Sum)?)
        })?;
        Ok(loss.value())
    }

    /// The decoder layers on the token rows `x0`: one loop over the stacked weights, whose
    /// matrices are laid out as `W` (without [`Model::remat_last_layer`], a loop over all
    /// but the last iteration's layers, and that iteration after it).
    pub(super) fn layers<'p, W: StackedWeights>(
        &self,
        p: &'p Spmd<'_, ModelMesh>,
        x0: &DTensor<'p, ModelMesh, TokenRows>,
        cos: Value,
        sin: Value,
    ) -> Result<DTensor<'p, ModelMesh, TokenRows>, CollectiveError> {
        let stacks = &self.layers;
        let vectors = [stacks.attention_norm, stacks.mlp_norm]
            .map(|v| p.declare::<StackedVector, Invariant>(v))
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        let matrices = [
            stacks.wq, stacks.wk, stacks.wv, stacks.wo, stacks.w1, stacks.w3, stacks.w2,
        ]
        .map(|v| p.declare::<W, Invariant>(v))
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
        // With `k` layers per iteration, group `j` holds layers `j, j + k, j + 2k, ...`, so
        // iteration `i` runs layers `i k .. i k + k` in order.
        let k = self.layers_per_iteration;
        let groups = (0..k)
            .map(|j| -> Result<_, CollectiveError> {
                Ok((
                    vectors
                        .iter()
                        .map(|t| every_kth_layer(t, j, k))
                        .collect::<Result<Vec<_>, _>>()?,
                    matrices
                        .iter()
                        .map(|t| every_kth_layer(t, j, k))
                        .collect::<Result<Vec<_>, _>>()?,
                ))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let iterations = self.m.layers / k;
        if self.remat_last_layer {
            return p.scan(iterations, x0, &groups, |p, _i, x, rows| {
                self.iteration::<W>(p, x, &rows, cos, sin)
            });
        }
        // The last iteration runs after the loop: its backward, the first after the loss's,
        // then reads the activations its forward computed instead of re-running it, which
        // holds them through the loss (PyTorch's `checkpoint_sequential` leaves its last
        // segment out likewise).
        let looped = iterations - 1;
        let x = if looped > 0 {
            // The loop reads its layers' rows of the whole stacks by index, so that the
            // stacks are not copied without their last layer.
            p.scan(looped, x0, &(), |p, i, x, ()| {
                let rows = layer_rows::<W>(p, &groups, i.value())?;
                self.iteration::<W>(p, x, &rows, cos, sin)
            })?
        } else {
            x0.clone()
        };
        let last = p.with_builder(|f| Ok(f.scalar(looped as f64, DType::I32)?))?;
        let rows = layer_rows::<W>(p, &groups, last)?;
        self.iteration::<W>(p, x, &rows, cos, sin)
    }

    /// One iteration of the layer loop on `p` (the loop's body, or the program for the
    /// iteration run after the loop): its layers in order, each with its row of every stack.
    fn iteration<'p, W: StackedWeights>(
        &self,
        p: &'p Spmd<'_, ModelMesh>,
        mut x: DTensor<'p, ModelMesh, TokenRows>,
        rows: &[LayerRows<'p, W>],
        cos: Value,
        sin: Value,
    ) -> Result<DTensor<'p, ModelMesh, TokenRows>, CollectiveError> {
        // With the all-gather matmul, each matrix enters its matmul as this device's rows;
        // otherwise whole.
        let collective = self.collective_matmul.map(|l| CollectiveMatmul::new(p, l));
        let matrix = |row: &DTensor<'_, ModelMesh, W::Row>| {
            if collective.is_some() {
                W::rows(row, self.dtype)
            } else {
                W::whole(row, self.dtype)
            }
        };
        for (vectors, matrices) in rows {
            let w = LayerParams {
                attention_norm: vectors[0].value(),
                mlp_norm: vectors[1].value(),
                wq: matrix(&matrices[0])?,
                wk: matrix(&matrices[1])?,
                wv: matrix(&matrices[2])?,
                wo: matrix(&matrices[3])?,
                w1: matrix(&matrices[4])?,
                w3: matrix(&matrices[5])?,
                w2: matrix(&matrices[6])?,
            };
            let mm = Matmul {
                dtype: self.dtype,
                collective: collective.as_ref(),
            };
            x = self.layer(p, &x, &w, mm, cos, sin)?;
        }
        Ok(x)
    }

    /// One decoder layer on the token rows `x` with the weights `w` (one layer's) and their
    /// matmul `mm`, built on `p` (the layer loop's body): each block a local computation of
    /// a typed tensor, the attention between them on the strategy's [`Seq`] blocks.
    pub(super) fn layer<'p>(
        &self,
        p: &'p Spmd<'_, ModelMesh>,
        x: &DTensor<'p, ModelMesh, TokenRows>,
        w: &LayerParams,
        mm: Matmul<'_>,
        cos: Value,
        sin: Value,
    ) -> Result<DTensor<'p, ModelMesh, TokenRows>, CollectiveError> {
        let m = self.m;
        let h = x.map_local(|f, x| {
            let x = cast(f, x, DType::F32)?;
            let (h, _) = rms_norm(f, x, w.attention_norm, m.norm_eps)?;
            cast(f, h, self.dtype)
        })?;
        // q, k (rotated) and v as each device's `[b, heads, s, head_dim]` block.
        let project = |weight: Value, heads: usize, rotate: bool| {
            h.map_local_as::<Seq, Invariant>(|f, h| {
                let y = mm.apply(f, h, weight)?;
                let y = if rotate {
                    rope(f, y, heads, cos, sin)?
                } else {
                    y
                };
                to_heads(f, y, self.b, self.s, heads)
            })
        };
        let q = project(w.wq, m.heads, true)?;
        let k = project(w.wk, m.kv_heads, true)?;
        let v = project(w.wv, m.kv_heads, false)?;
        let (out, _lse) = match self.segments {
            Some(segments) => {
                let segments = p.declare::<(Split<Data>, Replicated), Invariant>(segments)?;
                self.layer.forward_segmented(p, &q, &k, &v, &segments)?
            }
            None => self.layer.forward(p, &q, &k, &v)?,
        };
        let proj = out.map_local_as::<TokenRows, Invariant>(|f, out| {
            let out = if self.keep_attention {
                f.keep_for_backward(out)?
            } else {
                out
            };
            let out = from_heads(f, out)?;
            mm.apply(f, out, w.wo)
        })?;
        // The residual stream is in the compute dtype (MaxText's activation dtype), so the
        // layer loop saves each layer's input in it; the norms compute in f32.
        let x1 = x.add(&proj)?;
        let down = x1.map_local(|f, x1| {
            let x1_f32 = cast(f, x1, DType::F32)?;
            let (h2, _) = rms_norm(f, x1_f32, w.mlp_norm, m.norm_eps)?;
            let h2 = cast(f, h2, self.dtype)?;
            let a = mm.apply(f, h2, w.w1)?;
            let c = mm.apply(f, h2, w.w3)?;
            let act = silu(f, a)?;
            let gated = f.mul(act, c)?;
            mm.apply(f, gated, w.w2)
        })?;
        x1.add(&down)
    }
}

/// How a layer multiplies its activations by a weight matrix: a dot with the whole matrix
/// in the compute dtype, or the all-gather matmul of this device's rows of it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Matmul<'c> {
    pub(super) dtype: DType,
    pub(super) collective: Option<&'c CollectiveMatmul>,
}

impl Matmul<'_> {
    pub(super) fn apply(
        &self,
        f: &mut FuncBuilder<'_>,
        x: Value,
        w: Value,
    ) -> Result<Value, CollectiveError> {
        match self.collective {
            Some(c) => c.apply(f, x, w),
            None => Ok(f.matmul(x, w, self.dtype)?),
        }
    }
}
