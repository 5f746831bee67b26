//! The `tessera` command-line tool.

mod cli;

use std::process::ExitCode;

use clap::Parser;
use cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return cli::report_parse_error(e),
    };
    // Still one thread. libtpu loaded to compile for a topology (`tessera compile`) reads
    // these when it loads; the other commands leave the environment as it is, for libtpu's
    // client on a TPU VM (`--backend tpu`) reads the VM's own.
    if matches!(cli.command, Command::Compile(_) | Command::Tune(_)) {
        tessera::runtime::provision::set_libtpu_compile_only_env();
    }
    // Still one thread, and no plugin loaded yet.
    tessera::runtime::configure_plugin_logs(cli.verbose);
    // libtpu reads its dump flags once, when it loads: the commands that report kernel costs
    // ask for its dumps now. Without them they still compile, without costs.
    let _dumps = cli.command.reads_kernel_costs().then(|| {
        tessera::runtime::enable_libtpu_dumps()
            .inspect_err(|e| eprintln!("warning: no kernel costs: {e}"))
            .ok()
    });
    let result = match cli.command {
        Command::Kernels => {
            cli::kernel::list_kernels();
            Ok(true)
        }
        Command::Ir {
            kernel,
            params,
            args,
            rules,
            emit,
        } => cli::kernel::print_ir(&kernel, &params, args, &rules, emit).map(|()| true),
        Command::Run {
            kernel,
            params,
            inputs,
            outputs,
            backend,
            rules,
        } => cli::kernel::run_kernel(&kernel, &params, &inputs, &outputs, backend, &rules)
            .map(|()| true),
        Command::Demo { backends } => cli::demo::demo(&backends),
        Command::Attention(args) => cli::attention::attention_command(&args).map(|()| true),
        Command::Compile(args) => cli::compile::compile_command(&args).map(|()| true),
        Command::Bench { what } => cli::bench::bench(&what).map(|()| true),
        Command::Tune(args) => cli::tune::tune(&args).map(|()| true),
        Command::TpuDumpReport(args) => cli::tpu_dump::tpu_dump_report(&args).map(|()| true),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("error: some kernels disagree with their references");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
