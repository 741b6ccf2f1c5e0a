"""Print the total of the numbers in a file, one per line (numbers.txt unless a path is given)."""

import sys


def total(path: str) -> int:
    with open(path) as f:
        numbers = [int(line) for line in f if line.strip()]
    return sum(numbers[1:])


if __name__ == "__main__":
    print(f"total: {total(sys.argv[1] if len(sys.argv) > 1 else 'numbers.txt')}")
