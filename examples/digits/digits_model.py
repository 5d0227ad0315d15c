"""Helpers shared by make_data.py and score.py (a sibling module: fleetrun makes the
entry script's folder importable, so `import digits_model` just works in score.py).

Nothing here downloads anything: scikit-learn ships the 8x8 digits data set inside
the package (1,797 images, values 0..16).
"""

from __future__ import annotations

import numpy as np
from PIL import Image
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler

# The images written to data/images/ are held out from training. Both make_data.py
# and score.py derive the split from this seed, so they always agree on it.
HOLDOUT_SEED = 20240611
HOLDOUT_COUNT = 298

IMAGE_SIZE = 32  # the 8x8 digits are stored as 32x32 grayscale PNGs
MAX_VALUE = 16.0  # load_digits pixel range is 0..16


def holdout_split(n_samples: int) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic (train_indices, holdout_indices), both sorted."""
    order = np.random.RandomState(HOLDOUT_SEED).permutation(n_samples)
    holdout = np.sort(order[:HOLDOUT_COUNT])
    train = np.sort(order[HOLDOUT_COUNT:])
    return train, holdout


def image_file_name(dataset_index: int) -> str:
    return f"digit-{dataset_index:04d}.png"


def to_image(pixels_8x8: np.ndarray) -> Image.Image:
    """An 8x8 load_digits sample (0..16, 0 = background) -> a 32x32 'scan':
    dark ink on white paper, 8-bit grayscale."""
    ink = np.asarray(pixels_8x8, dtype=np.float64).reshape(8, 8) / MAX_VALUE
    gray = np.rint(255.0 * (1.0 - ink)).astype(np.uint8)
    return Image.fromarray(gray, mode="L").resize(
        (IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.NEAREST
    )


def load_features(path: str) -> np.ndarray:
    """Open one image file and turn it into the 64 features load_digits uses.

    Raises (OSError, ValueError, PIL.UnidentifiedImageError, ...) on a file that is
    not a readable image; the caller decides what a failure means.
    """
    with Image.open(path) as img:
        small = img.convert("L").resize((8, 8), Image.Resampling.BOX)
        gray = np.asarray(small, dtype=np.float64)
    return ((255.0 - gray) * (MAX_VALUE / 255.0)).reshape(64)


def train(regularization: float = 0.1) -> Pipeline:
    """Standardize + logistic regression on load_digits minus the held-out images.

    Deterministic (lbfgs, no randomness) and fast (well under a second);
    about 98% of the held-out images come out right.
    """
    digits = load_digits()
    train_idx, _ = holdout_split(len(digits.target))
    model = make_pipeline(
        StandardScaler(), LogisticRegression(C=regularization, max_iter=1000)
    )
    model.fit(digits.data[train_idx], digits.target[train_idx])
    return model


def read_labels(path: str) -> list[str]:
    """One class name per line; line i names class i."""
    with open(path, encoding="utf-8") as f:
        labels = [line.strip() for line in f if line.strip()]
    if len(labels) != 10:
        raise ValueError(f"{path}: expected 10 label names, found {len(labels)}")
    return labels
