#!/bin/sh
# Floods permission requests without reading its answers: request "q", then
# $N more with the same id (refused: "q" is still open), then "last". Only
# once $FIFO has been opened for writing does it read its stdin, appending
# each answer to $OUT until the answer to "last"; then it answers.
IFS= read -r first
echo '{"type":"permission","id":"q","title":"Q"}'
yes '{"type":"permission","id":"q","title":"Q"}' | head -n "$N"
echo '{"type":"permission","id":"last","title":"Last"}'
: < "$FIFO"
sed '/"id":"last"/q' > "$OUT"
echo '{"type":"final","text":"done"}'
