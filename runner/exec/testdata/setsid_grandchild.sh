#!/bin/sh
# Starts a grandchild that leaves the process group with setsid (writing its
# own pid and then the grandchild's to $PIDFILE) and keeps running.
setsid sleep 60 </dev/null >/dev/null 2>&1 &
# setsid(1) calls setsid(2) and then execs sleep: wait for the exec.
until [ "$(cat /proc/$!/comm 2>/dev/null)" = sleep ]; do sleep 0.01; done
echo $$ > "$PIDFILE.tmp"
echo $! >> "$PIDFILE.tmp"
mv "$PIDFILE.tmp" "$PIDFILE"
echo '{"type":"heartbeat"}'
sleep 60 &
wait
