//! Data parallelism: one batch split across devices, each device computing its share of the
//! loss's gradient on its own copy of the model, the shares summed by burn-collective's
//! all-reduce. The caller weights each shard's loss so that the shares sum to the whole batch's
//! loss (for a mean over `T` tokens: each shard's token sum divided by the whole batch's `T`);
//! the summed gradient is then the one-device gradient, up to the order of the additions.
//!
//! Each device runs its shard on its own thread, a peer of the collective. burn-autodiff 0.21
//! differentiates one graph at a time in a process ([`rein_model::one_graph`]), so the forward
//! and backward passes take turns, and each all-reduce runs after its peer released the graph.
//! On a CPU the devices are the one CPU device several times: the numbers separate GPUs would
//! give, none of the speed.

use std::sync::Mutex;

use burn::collective::{CollectiveConfig, PeerId, ReduceOperation, finish_collective, register};
use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, DeviceId, DeviceOps};
use burn::tensor::{ElementConversion, Tensor};

use crate::LmError;

/// burn-collective has one local collective per process and backend: one data-parallel step at
/// a time.
static COLLECTIVE: Mutex<()> = Mutex::new(());

/// `n` devices of the kind of `first`, numbered from it (`cuda:0`, `cuda:1`, …; on the CPU, the
/// CPU `n` times).
pub fn devices<D: DeviceOps>(first: &D, n: usize) -> Vec<D> {
    let id = first.id();
    (0..n)
        .map(|i| D::from_id(DeviceId::new(id.type_id, id.index_id + i as u16)))
        .collect()
}

/// `rows` split into `shares` contiguous ranges, as even as they go (the first ones one longer).
pub fn row_shares(rows: usize, shares: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    let (base, extra) = (rows / shares.max(1), rows % shares.max(1));
    (0..shares).scan(0, move |start, s| {
        let len = base + usize::from(s < extra);
        let range = *start..*start + len;
        *start += len;
        Some(range)
    })
}

/// The gradient of `Σ_s loss(s, model_s, device_s)` over the shards `s = 0..devices.len()`:
/// shard `s` on `devices[s]` with its own copy of `model`, the gradients summed by an all-reduce
/// (the same sum on every device, as each would apply it). Returns the gradients on
/// `devices[0]` and each shard's loss.
///
/// # Errors
/// The collective's, naming the operation.
pub fn gradients<B, M, F>(model: &M, devices: &[B::Device], loss: F) -> Result<(GradientsParams, Vec<f64>), LmError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B> + Send,
    F: Fn(usize, &M, &B::Device) -> Tensor<B, 1> + Sync,
{
    let _collective = COLLECTIVE.lock().unwrap_or_else(|e| e.into_inner());
    let config = CollectiveConfig::default().with_num_devices(devices.len());
    let failed = |what: &str| {
        let what = what.to_string();
        move |e| {
            LmError::Unsupported(format!(
                "data parallelism over {} devices: {what}: {e:?}",
                devices.len()
            ))
        }
    };
    let outcomes: Vec<Result<(GradientsParams, f64), LmError>> = std::thread::scope(|scope| {
        let peers: Vec<_> = (devices.iter().enumerate())
            .map(|(s, device)| {
                let (replica, loss, config) = (model.clone().fork(device), &loss, config.clone());
                scope.spawn(move || {
                    let peer = PeerId::from(s as u32);
                    register::<B::InnerBackend>(peer, device.clone(), config).map_err(failed("registering"))?;
                    let (grads, value) = {
                        let _graph = rein_model::one_graph();
                        let value = loss(s, &replica, device);
                        let scalar: f64 = value.clone().into_scalar().elem();
                        (GradientsParams::from_grads(value.backward(), &replica), scalar)
                    };
                    let reduced = grads.all_reduce::<B::InnerBackend>(peer, ReduceOperation::Sum);
                    finish_collective::<B::InnerBackend>(peer).map_err(failed("finishing"))?;
                    Ok((reduced.map_err(failed("the gradients' all-reduce"))?, value))
                })
            })
            .collect();
        (peers.into_iter())
            .map(|peer| {
                peer.join()
                    .unwrap_or_else(|_| Err(LmError::Unsupported("a data-parallel peer panicked".into())))
            })
            .collect()
    });
    let mut values = Vec::with_capacity(outcomes.len());
    let mut first = None;
    for outcome in outcomes {
        let (grads, value) = outcome?;
        values.push(value);
        first.get_or_insert(grads);
    }
    let grads = first.ok_or_else(|| LmError::Unsupported("data parallelism over no device".into()))?;
    Ok((grads.to_device(&devices[0], model), values))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_shares_cover_every_row_once_as_evenly_as_they_go() {
        for rows in 1..12 {
            for shares in 1..=rows {
                let ranges: Vec<_> = row_shares(rows, shares).collect();
                assert_eq!(ranges.len(), shares);
                assert_eq!(
                    ranges.iter().flat_map(Clone::clone).collect::<Vec<_>>(),
                    (0..rows).collect::<Vec<_>>()
                );
                let lens: Vec<usize> = ranges.iter().map(ExactSizeIterator::len).collect();
                assert!(lens.iter().max().unwrap() - lens.iter().min().unwrap() <= 1, "{lens:?}");
            }
        }
    }
}
