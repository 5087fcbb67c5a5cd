#!/bin/sh
# A command tool slower than its timeout.
exec sleep 60
