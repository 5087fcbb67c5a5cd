#!/bin/sh
# Reports the signals it ignores (SigIgn, hex) and how a child that sends
# itself SIGINT ends (130 when SIGINT is not ignored).
while read -r k v; do
	[ "$k" = "SigIgn:" ] && ign=$v
done </proc/$$/status
sh -c 'kill -s INT $$; exit 0'
st=$?
printf '{"type":"final","text":"%s %s"}\n' "$ign" "$st"
