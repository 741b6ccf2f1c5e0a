#!/bin/bash
# Run by Harbor's verifier from the working directory after the agent finished.
if [ "$(cat greeting.txt 2>/dev/null)" = "Hello, Harbor!" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
