//! Op probes: single burn ops on the device under test against the same op in f64 on the host,
//! each followed by a device sync so a failing launch is pinned to its op. Where a parity row
//! fails, these say which op is responsible.

use std::path::Path;

use anyhow::Result;
use burn::tensor::activation::{sigmoid, silu, softmax};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData, TensorPrimitive};

use rein_model::ReinBackend;
use rein_model::lm::{Context, KvCache, load};

use crate::report::Report;

/// Deterministic values in (-2, 2) from a seed.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        })
        .collect()
}

/// A tensor's values, or the backend's error (a failed launch) instead of a panic.
pub fn read<B: Backend, const D: usize>(t: Tensor<B, D>) -> Result<Vec<f32>> {
    let data = t.try_into_data().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    data.convert::<f32>()
        .to_vec::<f32>()
        .map_err(|e| anyhow::anyhow!("{e:?}"))
}

fn worst(got: &[f32], want: &[f64]) -> f64 {
    got.iter()
        .zip(want)
        .map(|(g, w)| (f64::from(*g) - w).abs() / w.abs().max(1.0))
        .fold(0.0, |a: f64, d| if d.is_nan() { f64::INFINITY } else { a.max(d) })
}

/// Runs `op` and syncs: its launch errors, if any, belong to it.
fn launch<B: Backend>(report: &mut Report, name: &str, device: &B::Device, op: impl FnOnce() -> Result<()>) {
    let outcome = op().and_then(|()| B::sync(device).map_err(|e| anyhow::anyhow!("{e:?}")));
    match outcome {
        Ok(()) => report.info(format!("probe {name}"), "launched"),
        Err(e) => {
            let first = format!("{e:#}").lines().take(4).collect::<Vec<_>>().join(" | ");
            report.info(format!("probe {name}"), format!("FAILED: {first}"));
        }
    }
}

/// The key/value cache as generation uses it, each stage synced: filled by the prompt
/// (prefill), one decoding step, then every sequence leaving it (`retain` of no rows).
fn cached_forward<B: ReinBackend>(fixtures: &Path, device: &B::Device, report: &mut Report) {
    let model = match load::<B>(&fixtures.join("lm/qwen2-gqa"), device) {
        Ok(model) => model,
        Err(e) => return report.info("probe cached forward", format!("FAILED: {e}")),
    };
    let (batch, prompt) = (2, 6);
    let mut cache = KvCache::new(model.config(), batch, prompt + 4, device);
    launch::<B>(report, "empty kv cache (qwen2-gqa)", device, || Ok(()));
    let rope = model.rope(prompt + 4, device);
    let step = |start: usize, seq: usize, cache: &mut KvCache<B>| {
        let tokens: Vec<i64> = (0..batch * seq).map(|i| (i * 7 % 500) as i64).collect();
        let positions: Vec<i64> = (0..batch)
            .flat_map(|_| (start..start + seq).map(|p| p as i64))
            .collect();
        let ctx = Context {
            rope: &rope,
            positions: Tensor::<B, 2, Int>::from_data(TensorData::new(positions, [batch, seq]), device),
            padding: None,
            sequences: None,
            fused: None,
            routing: None,
        };
        let tokens = Tensor::<B, 2, Int>::from_data(TensorData::new(tokens, [batch, seq]), device);
        read(model.forward(tokens, &ctx, Some(cache)).sum()).map(drop)
    };
    launch::<B>(report, "prefill 6 tokens with cache", device, || {
        step(0, prompt, &mut cache)
    });
    launch::<B>(report, "decode 1 token with cache", device, || {
        step(prompt, 1, &mut cache)
    });
    launch::<B>(report, "every sequence leaves the cache", device, || {
        cache.retain(&[]);
        Ok(())
    });
}

/// `[16,64]×[64,512]` against f64 on the host: burn's product and rein's
/// ([`rein_model::LinearKernels::matmul`], as [`rein_model::cuda_matmul`] chooses on CUDA).
pub fn matmul_precision<B: ReinBackend>(device: &B::Device, report: &mut Report) {
    let x = values(16 * 64, 1);
    let w = values(64 * 512, 2);
    let tensor = |v: &[f32], shape: [usize; 2]| Tensor::<B, 2>::from_data(TensorData::new(v.to_vec(), shape), device);
    let mut product = vec![0.0f64; 16 * 512];
    for i in 0..16 {
        for j in 0..512 {
            product[i * 512 + j] = (0..64)
                .map(|k| f64::from(x[i * 64 + k]) * f64::from(w[k * 512 + j]))
                .sum();
        }
    }
    let mut precision = |name: String, got: Result<Vec<f32>>| match got {
        Ok(got) => report.info(
            format!("probe {name}"),
            format!("max relative |Δ| vs f64: {:.3e}", worst(&got, &product)),
        ),
        Err(e) => report.info(format!("probe {name}"), format!("FAILED: {e:#}")),
    };
    precision(
        "burn matmul [16,64]×[64,512]".into(),
        read(tensor(&x, [16, 64]).matmul(tensor(&w, [64, 512]))),
    );
    let raw = |t: Tensor<B, 2>| t.into_primitive().tensor();
    precision(
        format!("rein matmul [16,64]×[64,512] ({:?})", rein_model::cuda_matmul()),
        read(Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(B::matmul(
            raw(tensor(&x, [16, 64])),
            raw(tensor(&w, [64, 512])),
        )))),
    );
}

/// The probes; every row is information, none gates the run.
pub fn run<B: ReinBackend>(fixtures: &Path, device: &B::Device, report: &mut Report) {
    cached_forward::<B>(fixtures, device, report);
    // Precision of the ops a transformer layer is made of, relative to f64 on the host.
    matmul_precision::<B>(device, report);
    let x = values(16 * 64, 1);
    let tensor = |v: &[f32], shape: [usize; 2]| Tensor::<B, 2>::from_data(TensorData::new(v.to_vec(), shape), device);
    let mut precision = |name: &str, got: Result<Vec<f32>>, want: Vec<f64>| match got {
        Ok(got) => report.info(
            format!("probe {name}"),
            format!("max relative |Δ| vs f64: {:.3e}", worst(&got, &want)),
        ),
        Err(e) => report.info(format!("probe {name}"), format!("FAILED: {e:#}")),
    };
    let f64s = |v: &[f32]| v.iter().map(|&a| f64::from(a)).collect::<Vec<f64>>();
    precision(
        "exp",
        read(tensor(&x, [16, 64]).exp()),
        f64s(&x).iter().map(|a| a.exp()).collect(),
    );
    precision(
        "sigmoid",
        read(sigmoid(tensor(&x, [16, 64]))),
        f64s(&x).iter().map(|a| 1.0 / (1.0 + (-a).exp())).collect(),
    );
    precision(
        "silu",
        read(silu(tensor(&x, [16, 64]))),
        f64s(&x).iter().map(|a| a / (1.0 + (-a).exp())).collect(),
    );
    precision(
        "sqrt(|x|)",
        read(tensor(&x, [16, 64]).abs().sqrt()),
        f64s(&x).iter().map(|a| a.abs().sqrt()).collect(),
    );
    precision(
        "x.powf(2) mean (rms)",
        read(tensor(&x, [16, 64]).powf_scalar(2.0).mean_dim(1)),
        (0..16)
            .map(|i| f64s(&x[i * 64..(i + 1) * 64]).iter().map(|a| a * a).sum::<f64>() / 64.0)
            .collect(),
    );
    precision(
        "sin, cos (|x| < 2)",
        read(Tensor::cat(
            vec![tensor(&x, [16, 64]).sin(), tensor(&x, [16, 64]).cos()],
            0,
        )),
        f64s(&x)
            .iter()
            .map(|a| a.sin())
            .chain(f64s(&x).iter().map(|a| a.cos()))
            .collect(),
    );
    let softmax_want: Vec<f64> = (0..16)
        .flat_map(|i| {
            let row = f64s(&x[i * 64..(i + 1) * 64]);
            let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = row.iter().map(|a| (a - max).exp()).sum();
            row.into_iter().map(move |a| (a - max).exp() / sum)
        })
        .collect();
    precision("softmax over 64", read(softmax(tensor(&x, [16, 64]), 1)), softmax_want);
}
