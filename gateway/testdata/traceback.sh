#!/bin/sh
# An agent that crashes the way a Python agent does: a traceback on stderr
# that prints its API key (from the environment), then exit status 1.
echo '{"type":"step_start","kind":"tool","name":"plan"}'
echo 'Traceback (most recent call last):' >&2
echo '  File "agent.py", line 7, in <module>' >&2
echo "openai.AuthenticationError: Incorrect API key provided: $OPENAI_API_KEY" >&2
exit 1
