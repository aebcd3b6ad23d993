"""`images-py`: the Python image helper (plugins/python-shared/rein_images.py) and the prompt
images a reward may read, seen from inside a component.

Reads the prompt's images. Each completion gets no score; the group's images give components:
`count`, `width` and `height` (the first image's, from its header), `red` (the first image's
pixels equal to (220, 30, 30), decoded), `checksum` (its decoded RGB bytes summed) and
`round_trip` (1 when writing the pixels as a PNG and decoding that gives them back).
"""

from wit_world import exports
from wit_world.exports.reward_api import CompletionScore, RewardInputs
from wit_world.imports.types import Component, PluginMetadata

from rein_images import decode_png, png_from_rgb, size


def components(images):
    out = [Component("count", float(len(images)))]
    if not images:
        return out
    width, height = size(images[0])
    pixels = decode_png(images[0])
    red = sum(1 for x, y in pixels.coordinates() if pixels.pixel(x, y) == (220, 30, 30))
    again = decode_png(png_from_rgb(pixels))
    return out + [
        Component("width", float(width)),
        Component("height", float(height)),
        Component("red", float(red)),
        Component("checksum", float(sum(pixels.rgb))),
        Component("round_trip", 1.0 if again == pixels else 0.0),
    ]


class RewardApi(exports.RewardApi):
    def metadata(self):
        return PluginMetadata("images-py", "0.1.0", "reports what the prompt's images hold", [])

    def inputs(self):
        return RewardInputs.IMAGES

    def init(self, config):
        pass

    def score(self, groups):
        out = []
        for group in groups:
            parts = components(group.images)
            out.append([CompletionScore(None, parts, []) for _ in group.completions])
        return out
