"""Write the reviews example's input: 200 reviews (and data/truth.txt to check against).

usage: python make_data.py
"""

import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
GOOD = ["great", "lovely", "fast", "friendly", "perfect", "fresh"]
BAD = ["awful", "slow", "broken", "rude", "stale", "late"]
PLAIN = ["the", "food", "was", "and", "service", "room", "delivery", "staff", "very"]


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def main():
    rng = random.Random(11)
    data = os.path.join(HERE, "data")
    truth = []
    for i in range(200):
        good = rng.random() < 0.5
        words = rng.choices(PLAIN, k=8) + rng.choices(GOOD if good else BAD, k=2)
        rng.shuffle(words)
        name = f"review-{i:03}.txt"
        write(os.path.join(data, "reviews", name), " ".join(words) + "\n")
        truth.append(f"{name} {'positive' if good else 'negative'}")
    write(os.path.join(data, "truth.txt"), "\n".join(truth) + "\n")
    print(f"wrote {data}")


if __name__ == "__main__":
    main()
