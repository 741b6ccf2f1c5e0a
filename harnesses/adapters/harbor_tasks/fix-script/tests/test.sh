#!/bin/bash
# Run by Harbor's verifier from the working directory after the agent finished.
# grade.py prints the reward (partial credit); it goes where Harbor reads it.
python3 /tests/grade.py > /logs/verifier/reward.txt
