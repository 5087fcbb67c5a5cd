#!/bin/sh
# The agent fails with a message for the user after some text.
echo '{"type":"delta","text":"partial"}'
echo '{"type":"error","message":"quota exceeded, try again tomorrow"}'
echo '{"type":"delta","text":" ignored after the error"}'
