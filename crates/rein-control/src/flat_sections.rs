//! Flat networks ([`FlatMlp`]) and their [`FlatAdam`] states as checkpoint sections: raw
//! little-endian `f32`s and Adam's bytes, read back only into buffers of the same size, and the
//! name of the first parameter that stopped being finite.

use rein_model::FlatMlp;
use rein_optim::FlatAdam;

use rein_run::checkpoint::{Checkpoint, CheckpointError};

/// Values as a section's bytes.
pub(crate) fn floats_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Reads the section `name` into `net`'s parameters, refusing another size.
pub(crate) fn read_params(checkpoint: &Checkpoint, name: &str, net: &mut FlatMlp) -> Result<(), CheckpointError> {
    read_floats(checkpoint, name, net.params_mut())
}

/// Reads the section `name` into `values`, refusing another size; on an error `values` is
/// unchanged.
pub(crate) fn read_floats(checkpoint: &Checkpoint, name: &str, values: &mut [f32]) -> Result<(), CheckpointError> {
    let bytes = checkpoint.section(name)?;
    if bytes.len() != 4 * values.len() {
        return Err(checkpoint.mismatch(format!(
            "section `{name}` holds {} bytes; the network has {} parameters ({} bytes)",
            bytes.len(),
            values.len(),
            4 * values.len()
        )));
    }
    for (p, b) in values.iter_mut().zip(bytes.chunks_exact(4)) {
        *p = f32::from_le_bytes(b.try_into().expect("4 bytes"));
    }
    Ok(())
}

/// Reads the section `name` into `adam`, refusing a state of another size.
pub(crate) fn read_adam(checkpoint: &Checkpoint, name: &str, adam: &mut FlatAdam) -> Result<(), CheckpointError> {
    adam.read_bytes(checkpoint.section(name)?)
        .map_err(|e| checkpoint.mismatch(format!("section `{name}`: {e}")))
}

/// The first of `net`'s parameters that is not finite, as `{prefix}layers.{l}.{weight|bias}`.
pub(crate) fn non_finite(net: &FlatMlp, prefix: &str) -> Option<String> {
    let at = net.params().iter().position(|p| !p.is_finite())?;
    Some(format!("{prefix}{}", net.param_name(at)))
}
