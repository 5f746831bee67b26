//! What the kernels of a program for a platform's devices are lowered as.

use tessera_dsl::{KernelLowering, Target};
use tessera_runtime::Platform;

/// The target the kernels of a program that runs on `platform` are built for, starting from
/// `target`: on TPU, Mosaic `tpu_custom_call`s (the program `tessera compile` compiles for a
/// topology; [`Target::tpu`] unless `target` already lowers to Mosaic), elsewhere inline
/// StableHLO (`target` itself, or its rules with inline lowering when it asked for Mosaic:
/// the XLA CPU and GPU compilers do not know the custom call).
pub fn kernel_target(platform: Platform, target: &Target) -> Target {
    match (platform.takes_mosaic_kernels(), target.lowering) {
        (true, KernelLowering::Mosaic) | (false, KernelLowering::Inline) => target.clone(),
        (true, KernelLowering::Inline) => Target::tpu(),
        (false, KernelLowering::Mosaic) => Target::inline(target.rules.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_dsl::TargetRules;

    #[test]
    fn tpu_takes_mosaic_and_the_others_inline_kernels() {
        let budget = TargetRules::tpu().with_vmem_limit(1 << 20);
        let tpu = Target {
            rules: budget.clone(),
            lowering: KernelLowering::Mosaic,
        };
        assert_eq!(kernel_target(Platform::Tpu, &tpu), tpu);
        assert_eq!(
            kernel_target(Platform::Tpu, &Target::portable()),
            Target::tpu()
        );
        for p in [Platform::Cpu, Platform::Gpu] {
            assert_eq!(kernel_target(p, &Target::portable()), Target::portable());
            assert_eq!(kernel_target(p, &tpu), Target::inline(budget.clone()));
        }
    }
}
