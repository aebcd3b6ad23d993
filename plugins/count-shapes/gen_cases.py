"""Writes cases.jsonl for `count-shapes` (and its Python port): boards drawn with Pillow, carried as
PNG data URLs in each group's `images`, the expected scores counted here from the drawing.

    .venv/bin/python plugins/count-shapes/gen_cases.py
"""

import base64
import io
import json
from pathlib import Path

from PIL import Image, ImageDraw

RED, GREEN, BLUE = (220, 30, 30), (30, 170, 60), (30, 60, 220)


def board(squares, side=24, mode="RGB"):
    """A white `side` x `side` board with `squares` ((x, y, size, colour)) as a PNG data URL."""
    image = Image.new("RGB", (side, side), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    for x, y, size, colour in squares:
        draw.rectangle([x, y, x + size - 1, y + size - 1], fill=colour)
    if mode == "P":
        image = image.convert("P", palette=Image.ADAPTIVE, colors=8)
    elif mode != "RGB":
        image = image.convert(mode)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def grid(cells, colour_of, side=24, cell=6):
    """Squares on a grid of `cell`-pixel cells with a one-pixel margin, as the shapes task draws them."""
    per_row = side // cell
    return [
        ((i % per_row) * cell + 1, (i // per_row) * cell + 1, cell - 2, colour_of[i])
        for i in cells
    ]


ANSWERS = ["<answer>2</answer>", "<answer>3</answer>", "two"]
CASES = [
    ("two red squares among blue ones", "How many red squares are there?<image>",
     [board(grid([0, 5, 9], {0: RED, 5: RED, 9: BLUE}))], ANSWERS, None, [1.0, 0.0, 0.0]),
    ("the colour named is the one counted", "How many blue squares are there?<image>",
     [board(grid([0, 5, 9, 10, 15], {0: RED, 5: BLUE, 9: BLUE, 10: BLUE, 15: GREEN}))], ANSWERS, None, [0.0, 1.0, 0.0]),
    ("an RGBA board", "How many red squares are there?<image>",
     [board(grid([1, 2], {1: RED, 2: RED}), mode="RGBA")], ANSWERS, None, [1.0, 0.0, 0.0]),
    ("a grey board counts black squares", "How many black squares are there?<image>",
     [board([(1, 1, 4, (0, 0, 0)), (8, 8, 4, (0, 0, 0)), (16, 1, 4, (0, 0, 0))], mode="L")], ANSWERS, None, [0.0, 1.0, 0.0]),
    ("a palette board", "How many green squares are there?<image>",
     [board(grid([3, 4, 12], {3: GREEN, 4: GREEN, 12: RED}), mode="P")], ANSWERS, None, [1.0, 0.0, 0.0]),
    ("squares are counted over all the prompt's images", "How many red squares are there in <image> and <image>?",
     [board(grid([0], {0: RED})), board(grid([7, 8], {7: RED, 8: RED}))], ANSWERS, None, [0.0, 1.0, 0.0]),
    ("touching squares are one shape", "How many red squares are there?<image>",
     [board([(1, 1, 4, RED), (5, 1, 4, RED), (14, 14, 4, RED)])], ANSWERS, None, [1.0, 0.0, 0.0]),
    ("single stray pixels are noise", "How many red squares are there?<image>",
     [board([(1, 1, 4, RED), (8, 8, 4, RED), (20, 20, 1, RED), (22, 2, 1, RED)])], ANSWERS, None, [1.0, 0.0, 0.0]),
    ("min_pixels 1 counts the stray pixels", "How many red squares are there?<image>",
     [board([(1, 1, 4, RED), (20, 20, 1, RED)])], ANSWERS, {"min_pixels": 1}, [1.0, 0.0, 0.0]),
    ("a colour within the tolerance counts", "How many red squares are there?<image>",
     [board([(1, 1, 4, RED), (8, 8, 4, (190, 60, 10))])], ANSWERS, None, [1.0, 0.0, 0.0]),
    ("tolerance 0 counts the exact colour only", "How many red squares are there?<image>",
     [board([(1, 1, 4, RED), (8, 8, 4, (190, 60, 10))])], ["<answer>1</answer>", "<answer>2</answer>"], {"tolerance": 0}, [1.0, 0.0]),
    ("colours of the config", "How many purple squares are there?<image>",
     [board([(1, 1, 4, (128, 0, 128)), (8, 8, 4, (128, 0, 128)), (16, 16, 4, RED)])], ANSWERS,
     {"colors": {"purple": [128, 0, 128]}}, [1.0, 0.0, 0.0]),
    ("a boxed answer with extract = boxed", "How many red squares are there?<image>",
     [board(grid([0, 5], {0: RED, 5: RED}))], ["\\boxed{2}", "<answer>2</answer>"], {"extract": "boxed"}, [1.0, 0.0]),
    ("a prompt naming no colour is not applicable", "How many squares are there?<image>",
     [board(grid([0], {0: RED}))], ANSWERS, None, [None, None, None]),
    ("a prompt naming two colours is not applicable", "Red or blue, how many?<image>",
     [board(grid([0], {0: RED}))], ANSWERS, None, [None, None, None]),
    ("a prompt without images is not applicable", "How many red squares are there?",
     [], ANSWERS, None, [None, None, None]),
    ("a 48-pixel board of eight red squares", "How many red squares are there?<image>",
     [board(grid(range(0, 64, 8), {i: RED for i in range(64)}, side=48), side=48)], ["<answer>8</answer>", "8", "<answer>9</answer>"],
     None, [1.0, 1.0, 0.0]),
]

lines = []
for name, prompt, images, completions, config, expected in CASES:
    case = {"name": name, "group": {"prompt": prompt, "completions": completions, "images": images}, "expected": expected}
    if config is not None:
        case["config"] = config
    lines.append(json.dumps(case))
Path(__file__).with_name("cases.jsonl").write_text("\n".join(lines) + "\n")
print(f"wrote {len(lines)} cases")
