"""Reads a run directory's TensorBoard event files back with TensorBoard's own reader
(`EventAccumulator`, orphaned data purged as TensorBoard does) and prints, as one JSON object,
each event directory's scalars and texts: {"<dir relative to tb/>": {"scalars": {tag: [[step,
value], ...]}, "texts": {tag: [text, ...]}}}. Used by the TensorBoard round-trip tests.

Usage: tensorboard_read.py RUN_DIR
"""

import json
import pathlib
import sys

from tensorboard.backend.event_processing import event_accumulator as ea


def read(directory):
    accumulator = ea.EventAccumulator(
        str(directory), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0}, purge_orphaned_data=True
    )
    accumulator.Reload()
    tags = accumulator.Tags()
    scalars = {tag: [[e.step, e.value] for e in accumulator.Scalars(tag)] for tag in tags["scalars"]}
    texts = {
        tag: [b"".join(e.tensor_proto.string_val).decode() for e in accumulator.Tensors(tag)]
        for tag in tags["tensors"]
    }
    return {"scalars": scalars, "texts": texts}


def main():
    tb = pathlib.Path(sys.argv[1]) / "tb"
    directories = [tb] + sorted(p for p in tb.iterdir() if p.is_dir())
    print(json.dumps({str(d.relative_to(tb)): read(d) for d in directories}))


if __name__ == "__main__":
    main()
