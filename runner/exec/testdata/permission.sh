#!/bin/sh
# Asks for permission. Writes $TURNGUARD_PERMISSIONS and the first line of
# stdin to $OUT, the lines of $PERM_REQUESTS (permission requests) to
# stdout, then reads $PERM_ANSWERS answers (default 1) from stdin, appending
# each to $OUT. Answers "allowed" when an answer allowed, else "denied"; "no
# answer" when stdin ends first.
IFS= read -r first
printf 'perms=%s\n%s\n' "$TURNGUARD_PERMISSIONS" "$first" > "$OUT"
printf '%s\n' "$PERM_REQUESTS"
n=${PERM_ANSWERS:-1}
verdict=denied
i=0
while [ "$i" -lt "$n" ]; do
	if ! IFS= read -r answer; then
		echo '{"type":"final","text":"no answer"}'
		exit 0
	fi
	printf '%s\n' "$answer" >> "$OUT"
	case "$answer" in *'"allowed":true'*) verdict=allowed ;; esac
	i=$((i + 1))
done
printf '{"type":"final","text":"%s"}\n' "$verdict"
