#!/bin/sh
# A command tool that leaves a mark: creates the file $1, then reports.
: > "$1"
echo "42% used"
