#!/bin/sh
# An exec agent that hangs: it starts a child in its process group and a
# grandchild that leaves the group with setsid, writes its own pid and
# theirs to $PIDFILE, starts a tool step and waits forever.
sleep 600 </dev/null >/dev/null 2>&1 &
child=$!
setsid sleep 600 </dev/null >/dev/null 2>&1 &
# setsid(1) calls setsid(2) and then execs sleep: wait for the exec.
until [ "$(cat /proc/$!/comm 2>/dev/null)" = sleep ]; do sleep 0.01; done
echo "$$ $child $!" > "$PIDFILE.tmp"
mv "$PIDFILE.tmp" "$PIDFILE"
echo '{"type":"step_start","kind":"tool","name":"hang"}'
wait
