#!/bin/sh
# A final event without text: the reply is the streamed deltas.
echo '{"type":"delta","text":"streamed "}'
echo '{"type":"delta","text":"reply"}'
echo '{"type":"final"}'
