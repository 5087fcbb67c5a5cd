#!/bin/sh
# Five lines that are not protocol events among valid ones; none is fatal.
echo 'Loading model...'
echo '{"type":"delta","text":"still "}'
echo '[1, 2, 3]'
echo '{"type":"teleport"}'
echo '{"text":"no type"}'
echo ''
echo '{"type":"step_start","kind":"tool"}'
echo '{"type":"delta","text":"fine"}'
echo '{"type":"final"}'
