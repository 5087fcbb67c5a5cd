#!/bin/sh
# A command tool that never finishes: writes its pid to $PIDFILE, then sleeps.
echo $$ > "$PIDFILE"
exec sleep 60
