#!/bin/sh
# Writes events whose agent-chosen values are 100,000 bytes long: an
# unknown type, a permission request's id, an event after the answer, and
# the error message itself.
big=$(head -c 100000 /dev/zero | tr '\0' x)
printf '{"type":"%s"}\n' "$big"
printf '{"type":"error","message":"%s"}\n' "$big"
printf '{"type":"%s"}\n' "$big"
