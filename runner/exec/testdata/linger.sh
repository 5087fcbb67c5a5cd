#!/bin/sh
# Answers, then does not exit.
echo '{"type":"final","text":"answered"}'
sleep 60
