"""fleetrun entry script: classify handwritten digit images.

init()  trains a small classifier once per worker process (load_digits minus the images we
        score, so the model never saw them), and reads the label names (side input).
run()   gets a mini-batch (a list of local image paths) and returns one line per
        image it could read: "<file name> <label name> <probability>".
        An unreadable image is logged and left out of the returned list; fleetrun
        counts every missing element as a failed item (see error_threshold).
"""

import argparse
import os
import time

from azureml_user.parallel_run import EntryScript

import digits_model  # a sibling module, shipped next to this script

HERE = os.path.dirname(os.path.abspath(__file__))

_model = None
_labels = None
_logger = None


def _resolve(path):
    """A relative path in `arguments` is taken relative to this script's folder
    (where job.toml is), falling back to the current directory."""
    if os.path.isabs(path):
        return path
    beside = os.path.join(HERE, path)
    return beside if os.path.exists(beside) else path


def init():
    global _model, _labels, _logger
    parser = argparse.ArgumentParser()
    parser.add_argument("--labels", required=True, help="file with one class name per line")
    parser.add_argument("--regularization", type=float, default=0.1,
                        help="inverse regularization strength C of the classifier")
    args, _unknown = parser.parse_known_args()

    entry = EntryScript()
    _logger = entry.logger
    _labels = digits_model.read_labels(_resolve(args.labels))

    start = time.perf_counter()
    _model = digits_model.train(regularization=args.regularization)
    _logger.info(
        "%s on node %s: model trained in %.2f s (C=%g), labels %s",
        entry.agent_name, entry.node_id, time.perf_counter() - start,
        args.regularization, ",".join(_labels),
    )


def run(mini_batch):
    names, features = [], []
    for path in mini_batch:
        try:
            features.append(digits_model.load_features(path))
        except Exception as exc:  # noqa: BLE001 - any unreadable file is one failed item
            _logger.warning("cannot read %s: %s: %s", path, type(exc).__name__, exc)
            continue
        names.append(os.path.basename(path))

    if not names:
        return []
    probabilities = _model.predict_proba(features)
    rows = []
    for name, proba in zip(names, probabilities):
        best = int(proba.argmax())
        label = _labels[int(_model.classes_[best])]
        rows.append(f"{name} {label} {proba[best]:.4f}")
    _logger.debug("mini-batch of %d: %d scored", len(mini_batch), len(rows))
    return rows


def shutdown():
    if _logger is not None:
        _logger.info("shutdown: done")
