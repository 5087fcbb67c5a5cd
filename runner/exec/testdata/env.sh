#!/bin/sh
# Reports the environment and working directory it was started with.
printf '{"type":"final","text":"%s|%s|%s|%s|%s|%s"}\n' "$TURNGUARD_RUN_ID" "$TURNGUARD_SESSION_KEY" "$TURNGUARD_CHANNEL" "$AGENT_GREETING" "${GATEWAY_SERVER__TOKEN:-unset}" "$(pwd)"
