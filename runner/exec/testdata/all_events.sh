#!/bin/sh
# Speaks every event of the jsonl protocol, then answers with the message
# it read on stdin.
read -r msg
echo '{"type":"step_start","kind":"tool","name":"search"}'
echo '{"type":"heartbeat"}'
echo '{"type":"step_complete","kind":"tool","name":"search"}'
echo '{"type":"pause","reason":"waiting for approval"}'
echo '{"type":"resume"}'
echo '{"type":"step_start","kind":"llm","name":"local-model"}'
echo '{"type":"delta","text":"Hello, "}'
echo '{"type":"delta","text":"world"}'
echo '{"type":"step_complete","kind":"llm","name":"local-model"}'
printf '{"type":"final","text":"You said: %s"}\n' "$msg"
