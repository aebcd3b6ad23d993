//! Two sets of gradients, by parameter path, compared tensor by tensor.

use rein_model::safetensors_file::Tensors;

/// The same parameters on both sides, and every element of each of `ours` within `tolerance`
/// times the larger of 1 and the norm of `theirs`'s tensor.
pub fn assert_gradients_equal(what: &str, ours: &Tensors, theirs: &Tensors, tolerance: f32) {
    let names = |t: &Tensors| t.keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(ours), names(theirs), "{what}: the parameters");
    for ((name, (_, ours)), (_, (_, theirs))) in ours.iter().zip(theirs) {
        let norm = theirs.iter().map(|x| x * x).sum::<f32>().sqrt().max(1.0);
        for (i, (a, b)) in ours.iter().zip(theirs).enumerate() {
            assert!(
                (a - b).abs() <= tolerance * norm,
                "{what}: ∂loss/∂{name}[{i}]: {a} vs {b} (norm {norm})"
            );
        }
    }
}
