#!/bin/sh
# Floods stdout with junk and stderr with lines, then answers.
yes 'this is not json' | head -n 10000
yes 'warning: something on stderr' | head -n 10000 >&2
echo '{"type":"final","text":"done"}'
