"""A ParallelRunStep entry script, unchanged: it runs on Azure ML and on fleetrun alike.

The labels come from a side input whose path arrives through the arguments, the model
through azureml.core's Model.get_model_path, the GPU count through the variable
ParallelRunStep sets.
"""

import argparse
import json
import os

from azureml.core import Model
from azureml_user.parallel_run import EntryScript


def init():
    global labels, lexicon
    logger = EntryScript().logger
    parser = argparse.ArgumentParser()
    parser.add_argument("--labels_dir", required=True)
    args, _unknown = parser.parse_known_args()
    with open(os.path.join(args.labels_dir, "labels.txt"), encoding="utf-8") as f:
        labels = f.read().split()
    with open(Model.get_model_path("lexicon"), encoding="utf-8") as f:
        lexicon = json.load(f)
    gpus = int(os.environ.get("AZ_BATCHAI_GPU_COUNT_FOUND", "0"))
    logger.info("%d words, labels %s, %d GPUs", len(lexicon), labels, gpus)


def run(mini_batch):
    rows = []
    for path in mini_batch:
        with open(path, encoding="utf-8") as f:
            words = f.read().split()
        score = sum(lexicon.get(word, 0) for word in words)
        rows.append(f"{os.path.basename(path)} {labels[score > 0]} {score}")
    return rows
