//! What the kernels of a program for a platform's devices are lowered as.

use tessera_dsl::{KernelLowering, Lowering};
use tessera_runtime::Platform;

/// The lowering the kernels of a program that runs on `platform` are built for, starting from
/// `lowering`: on TPU, Mosaic `tpu_custom_call`s (the program `tessera compile` compiles for a
/// topology; [`Lowering::tpu`] unless `lowering` already lowers to Mosaic), elsewhere inline
/// StableHLO (`lowering` itself, or its rules with inline lowering when it asked for Mosaic:
/// the XLA CPU and GPU compilers do not know the custom call).
pub fn kernel_lowering(platform: Platform, lowering: &Lowering) -> Lowering {
    match (platform.takes_mosaic_kernels(), lowering.kernels) {
        (true, KernelLowering::Mosaic) | (false, KernelLowering::Inline) => lowering.clone(),
        (true, KernelLowering::Inline) => Lowering::tpu(),
        (false, KernelLowering::Mosaic) => Lowering::inline(lowering.rules.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_dsl::KernelRules;

    #[test]
    fn tpu_takes_mosaic_and_the_others_inline_kernels() {
        let budget = KernelRules::tpu().with_vmem_limit(1 << 20);
        let tpu = Lowering {
            rules: budget.clone(),
            ..Lowering::tpu()
        };
        assert_eq!(kernel_lowering(Platform::Tpu, &tpu), tpu);
        assert_eq!(
            kernel_lowering(Platform::Tpu, &Lowering::portable()),
            Lowering::tpu()
        );
        for p in [Platform::Cpu, Platform::Gpu] {
            assert_eq!(
                kernel_lowering(p, &Lowering::portable()),
                Lowering::portable()
            );
            assert_eq!(kernel_lowering(p, &tpu), Lowering::inline(budget.clone()));
        }
    }
}
