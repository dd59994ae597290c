"""Regenerate `digits.npz`, the 8x8 handwritten digits shipped with einspace (run once, by hand).

Source: the "Optical Recognition of Handwritten Digits" data set (E. Alpaydin, C. Kaynak,
UCI Machine Learning Repository, https://doi.org/10.24432/C50P49), test part, as bundled
with scikit-learn (`sklearn.datasets.load_digits`, BSD-3-Clause; the UCI data is CC BY 4.0).
1797 images of 8x8 pixels with integer values 0..16, labels 0..9.

einspace does not depend on scikit-learn at run time: this script only extracts the arrays
so the package can ship them (about 30 kB) and never download anything. Usage:

    pip install scikit-learn
    python evaluators/data/make_digits.py        # writes evaluators/data/digits.npz
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def main() -> None:
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = digits.images.astype(np.uint8)  # (1797, 8, 8), values 0..16
    labels = digits.target.astype(np.uint8)  # (1797,), values 0..9
    out = Path(__file__).with_name("digits.npz")
    np.savez_compressed(out, images=images, labels=labels)
    print(f"wrote {out}: images {images.shape}, labels {labels.shape}")


if __name__ == "__main__":
    main()
