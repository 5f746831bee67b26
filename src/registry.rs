//! The built-in kernels by name: the one list that the CLI (`tessera kernels`, `ir`, `run`,
//! `compile kernel`), `tessera demo`, `tessera bench kernels`, the backend tests and the TPU
//! compile tests find kernels in. Adding a kernel to it adds it to all of them.
//!
//! This file is the table: each family registers its kernels in its own home (their builds,
//! references, flop counts, cases and bench sets, and the list of its entries) on the
//! machinery every family implements (`tessera-registry`, re-exported here: entries,
//! parameters, instances, the bench sizes): the example kernels ([`crate::kernels::registry`]),
//! paged attention and the KV-cache update ([`tessera_paged::registry`]), the kernels that move
//! their own data ([`tessera_collective_kernels::registry`]) and splash attention
//! ([`tessera_splash::registry`]); [`KERNELS`] puts the lists one after another.
//!
//! An entry ([`KernelInfo`]) carries the kernel's parameters (with defaults and help) and,
//! for given parameter values ([`KernelInfo::instance`]):
//! - the kernel definition, its default argument specs and the values of the arguments the
//!   parameters fix (splash's block tables);
//! - its f64 reference, written separately from the kernel, and inputs the reference is exact
//!   for ([`Instance::inputs`]; splash's backward kernels get the forward's residuals);
//! - its floating-point operations per call ([`Instance::flops`]);
//! - the parameter sets it is checked at ([`KernelInfo::cases`], each with the largest error
//!   allowed against the reference) and timed at ([`KernelInfo::bench`]);
//! - where it has one, XLA's own program for the same computation ([`Instance::xla_program`],
//!   `tessera bench kernels`' baseline).
//!
//! A kernel may run on a device mesh (the collectives: [`KernelInfo::on_mesh`]): its build
//! gives the mesh ([`Instance::mesh`]), each device has its own arguments and outputs, and its
//! reference computes every device's outputs from every device's arguments. [`Instance`] is
//! per device throughout (a one-device kernel has one argument list), and
//! [`Instance::run`] runs either kind, so every consumer has one code path.
//!
//! Two kinds of parameter: compile-time ones (block sizes, dtype, mask, flags), which change
//! the kernel, and sizes, which only set the default arguments (`tessera ir` instantiates
//! with them; `tessera run` takes sizes from its inputs and checks any size given against
//! them, [`KernelInfo::check_sizes`]).
//!
//! The example kernels' block sizes are const generics, so a run-time choice dispatches over a
//! fixed set of sizes ([`BLOCK_SIZES`]). The splash kernels are built as the splash plans
//! build them: a [`SplashAttention`](tessera_splash::SplashAttention) configured from the
//! parameters, and the stage of its forward or backward plan that runs the kernel (so the
//! block-sparsity tables are the real ones).

pub use tessera_registry::*;

/// Every family's entries, in the order [`KERNELS`] lists them.
const FAMILIES: &[&[KernelInfo]] = &[
    crate::kernels::registry::KERNELS,
    tessera_paged::registry::KERNELS,
    tessera_collective_kernels::registry::KERNELS,
    tessera_splash::registry::KERNELS,
];

/// Every built-in kernel: the families' entries, one after another.
pub const KERNELS: &[KernelInfo] = &concat_families::<{ count_kernels(FAMILIES) }>(FAMILIES);

const fn count_kernels(families: &[&[KernelInfo]]) -> usize {
    let (mut family, mut count) = (0, 0);
    while family < families.len() {
        count += families[family].len();
        family += 1;
    }
    count
}

/// The entries of `families` in one array, at compile time (so [`KERNELS`] stays a plain
/// slice for its users).
const fn concat_families<const N: usize>(families: &[&[KernelInfo]]) -> [KernelInfo; N] {
    let mut all = [families[0][0]; N];
    let (mut family, mut at) = (0, 0);
    while family < families.len() {
        let mut i = 0;
        while i < families[family].len() {
            all[at] = families[family][i];
            at += 1;
            i += 1;
        }
        family += 1;
    }
    all
}

/// Looks a kernel up by name.
pub fn find(name: &str) -> Result<&'static KernelInfo, RegistryError> {
    KERNELS
        .iter()
        .find(|k| k.name == name)
        .ok_or_else(|| RegistryError::UnknownKernel {
            name: name.to_string(),
            known: KERNELS.iter().map(|k| k.name).collect(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every family's entries are complete (each family checks its own too), and no two
    /// kernels share a name.
    #[test]
    fn every_kernel_has_cases_a_reference_and_bench_parameters() {
        check_family(KERNELS);
        let mut names: Vec<_> = KERNELS.iter().map(|k| k.name).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before, "two registered kernels share a name");
    }

    #[test]
    fn errors_name_the_culprit() {
        let matmul = find("matmul").unwrap();
        let e = |given: &[(&str, &str)]| matmul.build(&owned(given)).unwrap_err().to_string();
        assert!(e(&[("BM", "48")]).contains("block sizes"));
        assert!(e(&[("dtype", "f64")]).contains("parameter dtype=f64: expected f32 or bf16"));
        assert!(e(&[("nope", "1")]).contains("has no parameter `nope`"));
        let e = find("conv").unwrap_err().to_string();
        assert!(
            e.starts_with("unknown kernel `conv`; built-in kernels: matmul"),
            "{e}"
        );
        let e = matmul
            .bench_instance(&[("M", "{size}")], |_| None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("bench parameter M={size}"), "{e}");
    }
}
