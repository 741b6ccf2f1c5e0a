#!/bin/bash
sed -i 's/sum(numbers\[1:\])/sum(numbers)/' sum_numbers.py
python3 sum_numbers.py
