#!/bin/sh
# A command tool that fails.
echo partial
echo boom >&2
exit 2
