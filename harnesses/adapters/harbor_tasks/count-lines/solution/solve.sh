#!/bin/bash
wc -l < data.txt | tr -d ' ' > answer.txt
cat answer.txt
