#!/bin/sh
# An exec agent whose tool waits for a human inside a step: it starts the
# step, pauses at once, resumes after PAUSE_SECONDS (default 1) and then
# hangs without another word, as a stuck tool would.
read -r msg
echo '{"type":"step_start","kind":"tool","name":"ask_human"}'
echo '{"type":"pause","reason":"waiting for approval"}'
sleep "${PAUSE_SECONDS:-1}"
echo '{"type":"resume"}'
exec sleep 60
