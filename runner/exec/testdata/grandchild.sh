#!/bin/sh
# Starts a grandchild (writing its pid to $PIDFILE) and keeps running.
sleep 60 &
echo $! > "$PIDFILE"
echo '{"type":"heartbeat"}'
sleep 60
