//! Splash plans kernel call by kernel call: each stage of a plan compiled as a program of its
//! own (the kernel lowered alone, its constant tables inlined, as in the whole program) and
//! fed the tensors the earlier stages produced on the device. Timed side by side, they show
//! where a splash program's time goes (`tessera bench attention --profile`).

use std::collections::HashMap;

use anyhow::{Context, Result};
use tessera::dsl::HostArray;
use tessera::hlo::{Module, TensorType};
use tessera::runtime::{Buffer, Client, HostBuffer};
use tessera::splash::{lower_stages, SplashAttention, Stage, StageArg, Tensor};

use super::timing::Timed;

/// Compiles every stage of `plans` (in order) as its own program and runs it once, feeding it
/// the tensors in `env` (device buffers; the stages add their outputs). Returns the stages
/// ready to time, named by their kernels (`prefix` before each name).
pub fn stage_programs(
    client: &Client,
    attn: &SplashAttention,
    plans: &[Stage],
    env: &mut HashMap<Tensor, Buffer>,
    pairs: f64,
    prefix: &str,
) -> Result<Vec<Timed>> {
    let mut out = Vec::with_capacity(plans.len());
    for stage in plans {
        let kernel = stage.def.name();
        let mut tensors: Vec<Tensor> = Vec::new();
        for a in &stage.args {
            if let StageArg::Tensor(t) = a {
                if !tensors.contains(t) {
                    tensors.push(*t);
                }
            }
        }
        let mut m = Module::new(format!("stage_{kernel}"));
        let mut f = m.func("main");
        let mut values = HashMap::new();
        for &t in &tensors {
            let spec = attn.tensor_spec(t);
            let dims: Vec<i64> = spec.shape.iter().map(|&d| d as i64).collect();
            values.insert(t, f.arg(TensorType::new(dims, spec.dtype))?);
        }
        lower_stages(&mut f, std::slice::from_ref(stage), &mut values)?;
        let results: Vec<_> = stage.outputs.iter().map(|t| values[t]).collect();
        f.finish(&results)?;
        let inputs = tensors
            .iter()
            .map(|t| {
                env.get(t)
                    .with_context(|| format!("stage `{kernel}` reads {t:?}, which is missing"))
                    .and_then(|b| copy_buffer(client, b))
            })
            .collect::<Result<Vec<_>>>()?;
        let timed = Timed::new(
            client,
            format!("{prefix}{kernel}"),
            &m,
            inputs,
            attn.kernel_flops(kernel, pairs),
            true,
        )?;
        let (_, _, outputs) = timed.run()?;
        env.extend(stage.outputs.iter().copied().zip(outputs));
        out.push(timed);
    }
    Ok(out)
}

/// Splash's inputs `q, k, v, dout` as device buffers.
pub fn input_env(client: &Client, inputs: &[HostArray]) -> Result<HashMap<Tensor, Buffer>> {
    let names = [Tensor::Q, Tensor::K, Tensor::V, Tensor::DOut];
    names
        .iter()
        .zip(inputs)
        .map(|(&t, a)| Ok((t, client.buffer_from_host(&HostBuffer::from_array(a)?, 0)?)))
        .collect()
}

/// A device buffer's contents in a new buffer (a program's inputs are owned by it).
fn copy_buffer(client: &Client, b: &Buffer) -> Result<Buffer> {
    Ok(client.buffer_from_host(&b.to_host()?, 0)?)
}
