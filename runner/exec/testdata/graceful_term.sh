#!/bin/sh
# On SIGTERM, says goodbye and exits.
trap 'echo "{\"type\":\"delta\",\"text\":\" (stopped)\"}"; exit 0' TERM
echo '{"type":"delta","text":"working"}'
sleep 60
