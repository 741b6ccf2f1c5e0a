#!/bin/bash
printf 'Hello, %s!\n' "$(cat name.txt)" > greeting.txt
cat greeting.txt
