#!/bin/sh
# On SIGTERM, says goodbye and exits. The sleep runs in the background and
# the shell waits with the `wait` builtin, which a trapped signal interrupts
# at once (a foreground command would delay the trap until it ends).
trap 'echo "{\"type\":\"delta\",\"text\":\" (stopped)\"}"; exit 0' TERM
echo '{"type":"delta","text":"working"}'
sleep 60 &
wait
