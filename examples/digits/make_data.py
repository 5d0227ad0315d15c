"""Generate the demo input under examples/digits/data/ (deterministic, no network).

- data/images/batch-NN/digit-IIII.png : 298 held-out load_digits samples as 32x32
  grayscale PNGs (IIII = index in load_digits), 50 per folder;
- two deliberately corrupt files among them (a text file named .png, and a PNG cut
  in half), so the demo shows per-item failure counting against error_threshold;
- data/labels.txt : the side input, class names "zero".."nine", one per line;
- data/truth.txt  : "<file name> <true label name>" per good image (for check.py).

Run it with the example's venv python: .venv/bin/python make_data.py
"""

from __future__ import annotations

import io
import os
import shutil
import sys

from sklearn.datasets import load_digits

import digits_model

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
IMAGES = os.path.join(DATA, "images")
LABEL_NAMES = ["zero", "one", "two", "three", "four",
               "five", "six", "seven", "eight", "nine"]
PER_FOLDER = 50


def png_bytes(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=False)
    return buf.getvalue()


def main() -> int:
    digits = load_digits()
    _, holdout = digits_model.holdout_split(len(digits.target))

    # Start from a clean folder so a re-run never leaves stale files behind.
    if os.path.isdir(IMAGES):
        shutil.rmtree(IMAGES)
    os.makedirs(IMAGES)

    truth = []
    last_png = b""
    for pos, idx in enumerate(holdout):
        folder = os.path.join(IMAGES, f"batch-{pos // PER_FOLDER:02d}")
        os.makedirs(folder, exist_ok=True)
        name = digits_model.image_file_name(int(idx))
        last_png = png_bytes(digits_model.to_image(digits.data[idx]))
        with open(os.path.join(folder, name), "wb") as f:
            f.write(last_png)
        truth.append(f"{name} {LABEL_NAMES[digits.target[idx]]}\n")

    # Two broken inputs that look like the others from the outside.
    with open(os.path.join(IMAGES, "batch-02", "digit-corrupt-a.png"), "wb") as f:
        f.write(b"this is not a PNG image, just some text that got the wrong name\n")
    with open(os.path.join(IMAGES, "batch-04", "digit-corrupt-b.png"), "wb") as f:
        f.write(last_png[: len(last_png) // 2])  # valid header, truncated data

    with open(os.path.join(DATA, "labels.txt"), "w", encoding="utf-8") as f:
        f.writelines(name + "\n" for name in LABEL_NAMES)
    with open(os.path.join(DATA, "truth.txt"), "w", encoding="utf-8") as f:
        f.writelines(truth)

    n_files = sum(len(files) for _, _, files in os.walk(IMAGES))
    print(f"make_data: {n_files} files in {os.path.relpath(IMAGES, HERE)} "
          f"({len(holdout)} digit images + 2 corrupt), labels in "
          f"{os.path.relpath(os.path.join(DATA, 'labels.txt'), HERE)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
