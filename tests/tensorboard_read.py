"""Reads a run directory's TensorBoard event files back with the reader TensorBoard's server
uses (`plugin_event_accumulator.EventAccumulator`, orphaned data purged) and prints, as one JSON object,
each event directory's scalars and texts: {"<dir relative to tb/>": {"scalars": {tag: [[step,
value], ...]}, "texts": {tag: [text, ...]}}}. Used by the TensorBoard round-trip tests.

Usage: tensorboard_read.py RUN_DIR
"""

import json
import pathlib
import sys

from tensorboard.backend.event_processing import plugin_event_accumulator as pea
from tensorboard.util import tensor_util


def read(directory):
    accumulator = pea.EventAccumulator(str(directory), size_guidance={pea.TENSORS: 0}, purge_orphaned_data=True)
    accumulator.Reload()

    def tags(plugin):
        try:
            return accumulator.PluginTagToContent(plugin)
        except KeyError:  # no data of that plugin in this directory
            return {}

    scalars = {
        tag: [[e.step, float(tensor_util.make_ndarray(e.tensor_proto))] for e in accumulator.Tensors(tag)]
        for tag in tags("scalars")
    }
    texts = {
        tag: [b"".join(e.tensor_proto.string_val).decode() for e in accumulator.Tensors(tag)]
        for tag in tags("text")
    }
    return {"scalars": scalars, "texts": texts}


def main():
    tb = pathlib.Path(sys.argv[1]) / "tb"
    directories = [tb] + sorted(p for p in tb.iterdir() if p.is_dir())
    print(json.dumps({str(d.relative_to(tb)): read(d) for d in directories}))


if __name__ == "__main__":
    main()
