//! Programs timed side by side in one process: each compiled once with its inputs on the
//! device, then all run in turn, repetition after repetition (interleaved, so a change in the
//! machine's load hits every program alike), after one warm-up run; the best time counts.
//! XLA's own large square dot runs among them: the machine's matmul peak, measured under the
//! same conditions as the kernels it is compared with. It brackets the work: in every
//! repetition it runs before and after the other programs, and every timed run is kept, so
//! the report can say how far the peak moved while the work ran ([`Timed::spread`]).

use std::time::Instant;

use anyhow::Result;
use tessera::dsl::{ArgSpec, DType};
use tessera::hlo::Module;
use tessera::runtime::{Buffer, Client, CompileOptions, HostBuffer, LoadedExecutable, XlaOption};

/// One program with its device inputs and the work one run does.
pub struct Timed {
    pub name: String,
    /// Floating-point operations counted for one run (GFLOP/s is this over the best time).
    pub flops: f64,
    pub compile_s: f64,
    /// The best time of the timed runs (infinite before [`time_all`]).
    pub best_s: f64,
    /// Processor time (all threads) of the best run: over `best_s`, how many cores it kept
    /// busy.
    pub best_cpu_s: f64,
    /// Back-to-back runs per repetition (the first run after another program can pay for
    /// memory that program released: measured +50% for XLA's 2048^3 dot after dense
    /// attention's 1.6 GB).
    pub runs_per_rep: usize,
    /// Runs before and after the other programs in every repetition (the matmul peak).
    pub bracket: bool,
    /// Seconds of every timed run.
    pub times: Vec<f64>,
    exe: LoadedExecutable,
    /// Each device's inputs (one list for a one-device program).
    inputs: Vec<Vec<Buffer>>,
}

impl Timed {
    /// Compiles `module` for one device of `client`: as tessera compiles kernels
    /// ([`tessera::backend::compile_options`]) when `kernel`, else with XLA's defaults (XLA's
    /// own dot, dense attention: programs as an XLA user runs them).
    pub fn new(
        client: &Client,
        name: impl Into<String>,
        module: &Module,
        inputs: Vec<Buffer>,
        flops: f64,
        kernel: bool,
    ) -> Result<Self> {
        let options = if kernel {
            tessera::backend::compile_options(client)
        } else {
            CompileOptions::single_device()
        };
        Self::compile(client, name, module, vec![inputs], flops, options)
    }

    /// Compiles `module`, a program of one partition per device of `client` (manually
    /// partitioned), whose device `d` takes `per_device[d]`; as tessera compiles kernels
    /// (XNNPACK off on the CPU plugin) when `kernel`, else with XLA's defaults.
    pub fn on_devices(
        client: &Client,
        name: impl Into<String>,
        module: &Module,
        per_device: Vec<Vec<Buffer>>,
        flops: f64,
        kernel: bool,
    ) -> Result<Self> {
        let options = CompileOptions::manual_partitions(per_device.len())?;
        let options = if kernel && client.platform_name() == "cpu" {
            options.with_xla_option("xla_cpu_use_xnnpack", XlaOption::Bool(false))
        } else {
            options
        };
        Self::compile(client, name, module, per_device, flops, options)
    }

    fn compile(
        client: &Client,
        name: impl Into<String>,
        module: &Module,
        inputs: Vec<Vec<Buffer>>,
        flops: f64,
        options: CompileOptions,
    ) -> Result<Self> {
        let start = Instant::now();
        let exe = client.compile(&module.to_mlir(), &options)?;
        Ok(Timed {
            name: name.into(),
            flops,
            compile_s: start.elapsed().as_secs_f64(),
            best_s: f64::INFINITY,
            best_cpu_s: f64::NAN,
            runs_per_rep: 1,
            bracket: false,
            times: Vec::new(),
            exe,
            inputs,
        })
    }

    /// Runs once; returns the seconds taken, the processor seconds and the outputs (on the
    /// device).
    pub fn run(&self) -> Result<(f64, f64, Vec<Buffer>)> {
        let refs: Vec<Vec<&Buffer>> = self.inputs.iter().map(|d| d.iter().collect()).collect();
        let cpu = process_cpu_s();
        let start = Instant::now();
        let outs = self.exe.execute(&refs)?;
        let secs = start.elapsed().as_secs_f64();
        Ok((
            secs,
            process_cpu_s() - cpu,
            outs.into_iter().flatten().collect(),
        ))
    }

    pub fn gflops(&self) -> f64 {
        self.flops / self.best_s / 1e9
    }

    /// The slowest timed run over the best: how far the program's speed moved during the
    /// timing (1 when it held still; NaN before [`time_all`]).
    pub fn spread(&self) -> f64 {
        let worst = self.times.iter().copied().fold(f64::NAN, f64::max);
        worst / self.best_s
    }

    /// GFLOP/s of the slowest timed run.
    pub fn worst_gflops(&self) -> f64 {
        self.gflops() / self.spread()
    }

    /// Runs `runs_per_rep` times, keeping the times when `timed`; returns the outputs of
    /// the last run.
    fn run_rep(&mut self, timed: bool) -> Result<Vec<Buffer>> {
        let mut outputs = Vec::new();
        for _ in 0..self.runs_per_rep {
            let (secs, cpu, outs) = self.run()?;
            if timed {
                self.times.push(secs);
                if secs < self.best_s {
                    self.best_s = secs;
                    self.best_cpu_s = cpu;
                }
            }
            outputs = outs;
        }
        Ok(outputs)
    }
}

/// Runs every program `reps + 1` times, interleaved (run 0 warms up), the bracketing ones
/// ([`Timed::bracket`]) before and after the others in every repetition; sets each best time
/// and returns each program's outputs of its last run.
pub fn time_all(programs: &mut [Timed], reps: usize) -> Result<Vec<Vec<Buffer>>> {
    let mut last: Vec<Vec<Buffer>> = programs.iter().map(|_| Vec::new()).collect();
    let order: Vec<usize> = {
        let (around, work): (Vec<usize>, Vec<usize>) =
            (0..programs.len()).partition(|&i| programs[i].bracket);
        around.iter().chain(&work).chain(&around).copied().collect()
    };
    for rep in 0..=reps {
        for &i in &order {
            last[i] = programs[i].run_rep(rep > 0)?;
        }
    }
    Ok(last)
}

/// One line on how far the peak `p` moved while the work ran (its runs before and after the
/// work, every repetition).
pub fn peak_spread_line(p: &Timed) -> String {
    format!(
        "{}: best {:.1} GFLOP/s, slowest {:.1} GFLOP/s over {} runs before and after the work \
         (spread {:.2}x)",
        p.name,
        p.gflops(),
        p.worst_gflops(),
        p.times.len(),
        p.spread()
    )
}

/// XLA's matmul peak for `dtype`: its own `n x n x n` dot, ready to time.
pub fn peak_program(client: &Client, n: usize, dtype: DType) -> Result<Timed> {
    let spec = ArgSpec::new(dtype, [n, n]);
    let inputs = random_buffers(client, &[spec.clone(), spec], 1)?;
    let flops = 2.0 * (n as f64).powi(3);
    let mut p = Timed::new(
        client,
        format!("xla dot {}", dtype.name()),
        &Module::square_dot(n, dtype)?,
        inputs,
        flops,
        false,
    )?;
    // Short: run twice per repetition, so one run follows a run of itself.
    p.runs_per_rep = 2;
    p.bracket = true;
    Ok(p)
}

/// Deterministic random arrays of the given specs, on device 0 (integer arrays are zeros).
fn random_buffers(client: &Client, specs: &[ArgSpec], seed: u64) -> Result<Vec<Buffer>> {
    specs
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let a = if s.dtype.is_float() {
                tessera::reference::random(s.dtype, &s.shape, seed + i as u64)
            } else {
                tessera::dsl::HostArray::zeros(s.dtype, s.shape.clone())
            };
            Ok(client.buffer_from_host(&HostBuffer::from_array(&a)?, 0)?)
        })
        .collect()
}

/// Processor seconds this process has used (user and system, all threads), from
/// `/proc/self/stat` (clock ticks of 10 ms); NaN where unavailable.
fn process_cpu_s() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return f64::NAN;
    };
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
    match (ticks(11), ticks(12)) {
        (Some(user), Some(system)) => (user + system) / 100.0,
        _ => f64::NAN,
    }
}
