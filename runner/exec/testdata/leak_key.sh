#!/bin/sh
# An agent that crashes with a traceback printing its API key (from the
# environment the gateway gave it) on stderr.
echo "Traceback (most recent call last):" >&2
echo "  openai.AuthenticationError: Incorrect API key provided: $OPENAI_API_KEY" >&2
exit 1
