#!/bin/sh
# Exits with status 3 and no final event, after twelve stderr lines.
echo '{"type":"delta","text":"half an answer"}'
for i in 1 2 3 4 5 6 7 8 9 10 11 12; do
	echo "stderr line $i" >&2
done
exit 3
