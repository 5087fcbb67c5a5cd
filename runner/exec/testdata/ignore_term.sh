#!/bin/sh
# Ignores SIGTERM (and so does its sleep): only SIGKILL stops it.
trap '' TERM
echo '{"type":"delta","text":"working"}'
sleep 60
