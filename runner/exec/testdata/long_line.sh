#!/bin/sh
# Writes 10 MiB of a delta line that never ends, then hangs.
printf '{"type":"delta","text":"'
head -c 10485760 /dev/zero | tr '\0' x
sleep 60 &
wait
