#!/bin/sh
# Streams 6 MiB of reply text in 64 KiB deltas, then ends without a final text.
line=$(printf '{"type":"delta","text":"%s"}' "$(head -c 65536 /dev/zero | tr '\0' x)")
i=0
while [ $i -lt 96 ]; do
	echo "$line"
	i=$((i + 1))
done
echo '{"type":"final"}'
