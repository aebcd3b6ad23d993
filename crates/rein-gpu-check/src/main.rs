//! `rein-gpu-check`: the one command that proves rein's CUDA path on a GPU machine that has no
//! Rust toolchain. `cargo xtask gpu-bundle` builds it (with `--features cuda`) and packs it with
//! the fixtures and `run.sh`; on the GPU machine it runs every parity row of the test suite on
//! the device (logits and greedy tokens against transformers, a GRPO step against PyTorch) and
//! times generation, a GRPO step and the matmul ceiling beside the PyTorch peer.
//!
//! It owns no model, sampler or loss of its own: everything it runs is rein's library code, so
//! what passes here is what `rein train` runs. With `--device cpu` it runs the same rows on the
//! CPU backend (how the test suite checks the CPU half of every row).

mod data_parallel;
mod parity;
mod probe;
mod report;
mod speed;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use rein_core::ModelDtype;
use rein_model::ReinBackend;

use crate::report::{Kind, Report};
use crate::speed::SpeedSetup;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum DeviceArg {
    /// The CPU backend (Flex), as the test suite runs.
    Cpu,
    /// The first CUDA device (burn-cuda); needs a build with `--features cuda`.
    Cuda,
    /// burn-wgpu's default device (a GPU, or Mesa's lavapipe on the CPU): the CubeCL kernels
    /// CUDA runs, compiled for Vulkan; needs a build with `--features wgpu`.
    Wgpu,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum SpeedRow {
    /// Greedy generation at each `--batches` size.
    Generation,
    /// One GRPO step, and its phases.
    Step,
    /// The matmul ceilings (burn's and rein's products; bf16 and TF32 on CUDA).
    Matmul,
    /// The GRPO step in mixed precision (bf16 products), and its phases.
    StepBf16,
    /// Greedy generation with bf16 products at each `--batches` size.
    GenerationBf16,
}

/// Parity and speed of rein on one device.
#[derive(Debug, Parser)]
#[command(name = "rein-gpu-check")]
struct Args {
    /// The device to check.
    #[arg(long, value_enum, default_value = "cuda")]
    device: DeviceArg,
    /// The fixtures folder (`tests/fixtures` of the repository, or the bundle's `fixtures`).
    #[arg(long, default_value = "fixtures")]
    fixtures: PathBuf,
    /// A causal-LM checkpoint for the speed rows (the peer script writes one).
    #[arg(long)]
    speed_model: Option<PathBuf>,
    /// The prompts of the speed rows (JSON list of token-id lists).
    #[arg(long)]
    prompts: Option<PathBuf>,
    /// Generation batch sizes.
    #[arg(long, value_delimiter = ',', default_value = "1,64,256")]
    batches: Vec<usize>,
    /// Tokens generated per sequence in the speed rows.
    #[arg(long, default_value_t = 128)]
    new_tokens: usize,
    /// Rows of the timed GRPO step.
    #[arg(long, default_value_t = 8)]
    step_rows: usize,
    /// Completion tokens of each row of the GRPO step (default: `--new-tokens`).
    #[arg(long)]
    step_tokens: Option<usize>,
    /// Skip the parity rows (speed only).
    #[arg(long)]
    no_parity: bool,
    /// Which speed rows to run (with `--speed-model`).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "generation,step,matmul,step-bf16"
    )]
    speed_rows: Vec<SpeedRow>,
    /// Run the op probes: single ops against f64, each launch synced (diagnosis).
    #[arg(long)]
    probe: bool,
    /// On the CPU, compute with burn's generic ops instead of rein's CPU kernels: the path a
    /// CUDA run takes.
    #[arg(long)]
    generic_ops: bool,
    /// Where the rows go, rewritten after each one.
    #[arg(long, default_value = "results.json")]
    out: PathBuf,
    /// Only say whether cuBLAS opens (its version, or why not and what to install) and exit:
    /// status 0 if it opened, 1 if not. Needs no GPU.
    #[arg(long)]
    cublas: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.cublas {
        return cublas();
    }
    if args.generic_ops {
        rein_model::use_generic_ops(true);
    }
    let report = match args.device {
        DeviceArg::Cpu => checks::<rein_model::Cpu>("cpu (Flex)", &args, &Default::default(), |_, _| {}),
        DeviceArg::Cuda => cuda(&args),
        DeviceArg::Wgpu => wgpu(&args),
    };
    let Some(report) = report else {
        return ExitCode::from(2);
    };
    println!("{}", report.table());
    if report.all_hold() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `--cublas`: one line, cuBLAS's version or why it does not open.
#[cfg(feature = "cuda")]
fn cublas() -> ExitCode {
    match rein_model::cublas_library() {
        Ok(version) => {
            println!("cuBLAS {version}");
            ExitCode::SUCCESS
        }
        Err(why) => {
            println!("{why}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(not(feature = "cuda"))]
fn cublas() -> ExitCode {
    eprintln!("error: this rein-gpu-check was built without CUDA; build it with `--features cuda`");
    ExitCode::from(2)
}

/// The info row counting the products launched through cuBLAS by every row before it.
#[cfg(feature = "cuda")]
const CUBLAS_CALLS: &str = "products: cuBLAS calls";

#[cfg(feature = "cuda")]
fn cuda(args: &Args) -> Option<Report> {
    use burn::backend::Cuda;
    use rein_model::CudaMatmul;
    type CudaBf16 = Cuda<burn::tensor::bf16>;
    let device = burn::backend::cuda::CudaDevice::default();
    checks::<Cuda>("cuda:0 (burn-cuda)", args, &device, |device, report| {
        // Launches CubeCL's profiler does not see (`profile.py` adds them).
        report.info(CUBLAS_CALLS, rein_model::cublas_calls().to_string());
        report.info(
            "products: cuBLAS",
            match rein_model::cublas_library() {
                Ok(version) => format!("cuBLAS {version}: every product above, f32 without TF32"),
                Err(why) => format!("not opened, products above on CubeCL's kernels: {why}"),
            },
        );
        if args.speed_model.is_none() || !args.speed_rows.contains(&SpeedRow::Matmul) {
            return;
        }
        for n in [4096, 8192] {
            parity::guarded::<CudaBf16>(report, device, "burn matmul bf16", Kind::Speed, |report| {
                speed::matmul_rate::<CudaBf16>("bf16", n, device, report)
            });
            parity::guarded::<CudaBf16>(report, device, "rein matmul bf16", Kind::Speed, |report| {
                speed::rein_matmul_rate::<CudaBf16>("bf16", n, device, report)
            });
        }
        // rein's products on CubeCL's kernels: full f32 (where cuBLAS is missing) and TF32
        // (their precision, too).
        for choice in [CudaMatmul::FullF32, CudaMatmul::Tf32] {
            rein_model::set_cuda_matmul(choice);
            probe::matmul_precision::<Cuda>(device, report);
            parity::guarded::<Cuda>(report, device, "rein matmul f32", Kind::Speed, |report| {
                speed::rein_matmul_rate::<Cuda>("f32", 4096, device, report)
            });
        }
        rein_model::set_cuda_matmul(CudaMatmul::default());
    })
}

#[cfg(not(feature = "cuda"))]
fn cuda(_: &Args) -> Option<Report> {
    eprintln!("error: this rein-gpu-check was built without CUDA; build it with `--features cuda`");
    None
}

#[cfg(feature = "wgpu")]
fn wgpu(args: &Args) -> Option<Report> {
    checks::<burn::backend::Wgpu>("wgpu (burn-wgpu)", args, &Default::default(), |_, _| {})
}

#[cfg(not(feature = "wgpu"))]
fn wgpu(_: &Args) -> Option<Report> {
    eprintln!("error: this rein-gpu-check was built without wgpu; build it with `--features wgpu`");
    None
}

/// Every row on backend `B`; `extra` adds the rows only the device allows (its other float
/// types, its other ways of multiplying).
fn checks<B: ReinBackend>(
    name: &str,
    args: &Args,
    device: &B::Device,
    extra: impl FnOnce(&B::Device, &mut Report),
) -> Option<Report> {
    let mut report = Report::new(name, Some(args.out.clone()));
    report.info(
        "build",
        format!(
            "rein-gpu-check {} ({})",
            env!("CARGO_PKG_VERSION"),
            std::env::consts::ARCH
        ),
    );
    if args.probe {
        probe::run::<B>(&args.fixtures, device, &mut report);
    }
    if !args.no_parity {
        parity::run::<B>(&args.fixtures, device, &mut report);
        data_parallel::run::<B>(&args.fixtures, device, &mut report);
    }
    if let (Some(model), Some(prompts)) = (&args.speed_model, &args.prompts) {
        let setup = SpeedSetup {
            model,
            prompts,
            batches: &args.batches,
            new_tokens: args.new_tokens,
            step_rows: args.step_rows,
            step_tokens: args.step_tokens.unwrap_or(args.new_tokens),
        };
        let rows = &args.speed_rows;
        if rows.contains(&SpeedRow::Generation) {
            parity::guarded::<B>(&mut report, device, "generation speed", Kind::Speed, |report| {
                speed::generation::<B>(&setup, ModelDtype::F32, device, report)
            });
        }
        if rows.contains(&SpeedRow::GenerationBf16) {
            parity::guarded::<B>(&mut report, device, "generation speed bf16", Kind::Speed, |report| {
                speed::generation::<B>(&setup, ModelDtype::Bf16, device, report)
            });
        }
        if rows.contains(&SpeedRow::Step) {
            parity::guarded::<B>(&mut report, device, "grpo step speed", Kind::Speed, |report| {
                speed::grpo_step::<B>(&setup, ModelDtype::F32, device, report)
            });
        }
        let ceilings: &[usize] = if rows.contains(&SpeedRow::Matmul) {
            &[4096, 8192]
        } else {
            &[]
        };
        for &n in ceilings {
            parity::guarded::<B>(&mut report, device, "burn matmul f32", Kind::Speed, |report| {
                speed::matmul_rate::<B>("f32", n, device, report)
            });
            parity::guarded::<B>(&mut report, device, "rein matmul f32", Kind::Speed, |report| {
                speed::rein_matmul_rate::<B>("f32", n, device, report)
            });
        }
        if rows.contains(&SpeedRow::StepBf16) {
            parity::guarded::<B>(&mut report, device, "grpo step speed bf16", Kind::Speed, |report| {
                speed::grpo_step::<B>(&setup, ModelDtype::Bf16, device, report)
            });
        }
    }
    extra(device, &mut report);
    Some(report)
}
