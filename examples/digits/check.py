"""Compare fleetrun's output rows with data/truth.txt and print a one-line summary.

usage: python check.py OUTPUT_FILE [TRUTH_FILE]
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    out_path = argv[1]
    truth_path = argv[2] if len(argv) > 2 else os.path.join(HERE, "data", "truth.txt")

    truth = {}
    with open(truth_path, encoding="utf-8") as f:
        for line in f:
            name, label = line.split()
            truth[name] = label

    rows = correct = 0
    seen = set()
    with open(out_path, encoding="utf-8") as f:
        for line in f:
            name, label, _prob = line.split()
            rows += 1
            seen.add(name)
            correct += truth.get(name) == label

    missing = sorted(set(truth) - seen)
    print(f"check: {rows} rows, {correct}/{rows} predicted correctly "
          f"({100.0 * correct / max(rows, 1):.1f}%), "
          f"{len(missing)} good images missing from the output"
          + (f" (e.g. {missing[0]})" if missing else ""))
    return 0 if rows == len(truth) and not missing else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
