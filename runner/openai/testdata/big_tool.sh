#!/bin/sh
# A command tool with 100 bytes of output.
head -c 100 /dev/zero | tr '\0' x
