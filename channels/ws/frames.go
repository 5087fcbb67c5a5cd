package ws

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Error codes of failed responses (the ones the real gateway uses).
const (
	CodeInvalidRequest = "INVALID_REQUEST" // bad params, unknown method, handshake failures
	CodeUnavailable    = "UNAVAILABLE"     // transient or refused for now (busy session, rate limit, shutdown)
	CodeForbidden      = "FORBIDDEN"       // not allowed (aborting another client's run)
)

// Close codes the server sends (besides 1009 for an oversized frame, which
// gorilla/websocket sends itself).
const (
	CloseProtocolMismatch = 1002 // after a PROTOCOL_MISMATCH response
	CloseUnsupportedData  = 1003 // binary frame
	CloseInvalidPayload   = 1007 // a text frame that is not UTF-8
	ClosePolicy           = 1008 // auth failure, frames before connect, handshake timeout, request flood
	CloseRestart          = 1012 // gateway shutdown
	CloseSlowConsumer     = 1013 // the client does not read its terminal events fast enough
)

// request is an inbound frame.
type request struct {
	Type   string          `json:"type"`
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
}

// rpcError is the error of a failed response.
type rpcError struct {
	Code         string `json:"code"`
	Message      string `json:"message"`
	Details      any    `json:"details,omitempty"`
	Retryable    bool   `json:"retryable,omitempty"`
	RetryAfterMs int64  `json:"retryAfterMs,omitempty"`
}

func (e *rpcError) Error() string { return e.Code + ": " + e.Message }

func invalid(format string, args ...any) *rpcError {
	return &rpcError{Code: CodeInvalidRequest, Message: fmt.Sprintf(format, args...)}
}

func unavailable(msg string) *rpcError { return &rpcError{Code: CodeUnavailable, Message: msg} }

// response is an outbound res frame.
type response struct {
	Type    string          `json:"type"`
	ID      json.RawMessage `json:"id"`
	OK      bool            `json:"ok"`
	Payload any             `json:"payload,omitempty"`
	Error   *rpcError       `json:"error,omitempty"`
}

var emptyID = json.RawMessage(`""`)

// resFrame encodes a response to the request with id (a JSON string; ""
// when the request had none usable). A failed response may carry a payload
// too (the agent method's final error does).
func resFrame(id json.RawMessage, payload any, rerr *rpcError) outFrame {
	if len(id) == 0 {
		id = emptyID
	}
	r := response{Type: "res", ID: id, OK: rerr == nil, Payload: payload, Error: rerr}
	if rerr == nil && payload == nil {
		r.Payload = struct{}{}
	}
	return outFrame{data: mustJSON(r)}
}

// eventHead returns an event frame up to its seq value: the writer appends
// the number and the closing brace.
func eventHead(name string, payload []byte) []byte {
	b := make([]byte, 0, len(payload)+len(name)+48)
	b = append(b, `{"type":"event","event":"`...)
	b = append(b, name...)
	b = append(b, `","payload":`...)
	b = append(b, payload...)
	b = append(b, `,"seq":`...)
	return b
}

// challengeFrame is the first frame of every connection, with its nonce.
// It has no seq: frame seq starts with the first event after hello.
func challengeFrame(nonce string) outFrame {
	p := mustJSON(map[string]any{"nonce": nonce, "ts": time.Now().UnixMilli()})
	b := append([]byte(`{"type":"event","event":"connect.challenge","payload":`), p...)
	return outFrame{data: append(b, '}')}
}

func tickFrame() outFrame {
	b := make([]byte, 0, 64)
	b = append(b, `{"type":"event","event":"tick","payload":{"ts":`...)
	b = strconv.AppendInt(b, time.Now().UnixMilli(), 10)
	b = append(b, `},"seq":`...)
	return outFrame{data: b, seq: true, kind: kindTick}
}

// mustJSON encodes v as encoding/json does but without HTML escapes (<, >
// and & stay one byte, as in jsonstr.Append): frames are not HTML, and the
// answer budgets (jsonLen) count these characters as one byte.
func mustJSON(v any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		panic("ws: encoding a frame: " + err.Error()) // only our own types are encoded
	}
	return bytes.TrimSuffix(b.Bytes(), []byte{'\n'})
}

// parseFrame decodes an inbound text frame. The error is the message of an
// INVALID_REQUEST response; id is the request id when one could be read.
func parseFrame(data []byte) (req request, err error) {
	if err := json.Unmarshal(data, &req); err != nil {
		return request{}, fmt.Errorf("invalid frame: %s", jsonProblem(err))
	}
	if !isJSONString(req.ID) {
		req.ID = nil
		if req.Type != "req" {
			return req, fmt.Errorf("invalid frame: type must be \"req\", got %q", clip(req.Type, 40))
		}
		return req, errors.New("invalid frame: id must be a string")
	}
	if req.Type != "req" {
		return req, fmt.Errorf("invalid frame: type must be \"req\", got %q", clip(req.Type, 40))
	}
	if req.Method == "" {
		return req, errors.New("invalid frame: method is missing")
	}
	return req, nil
}

func isJSONString(raw json.RawMessage) bool {
	if len(raw) < 2 || raw[0] != '"' {
		return false
	}
	var s string
	return json.Unmarshal(raw, &s) == nil
}

// decodeParams decodes a request's params into v. Absent or null params are
// {}. Unknown fields are ignored.
func decodeParams(method string, raw json.RawMessage, v any) *rpcError {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	if raw[0] != '{' {
		return invalid("invalid %s params: must be an object", method)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return invalid("invalid %s params: %s", method, jsonProblem(err))
	}
	return nil
}

// jsonProblem turns a decoding error into words that name the field.
func jsonProblem(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		return fmt.Sprintf("%s must be %s, not %s", te.Field, typeWord(te.Type.Kind().String()), te.Value)
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("malformed JSON at byte %d: %s", se.Offset, strings.TrimPrefix(se.Error(), "json: "))
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}

func typeWord(kind string) string {
	switch {
	case kind == "string":
		return "a string"
	case strings.HasPrefix(kind, "int"), strings.HasPrefix(kind, "uint"), strings.HasPrefix(kind, "float"):
		return "a number"
	case kind == "bool":
		return "true or false"
	case kind == "slice":
		return "an array"
	case kind == "map", kind == "struct":
		return "an object"
	}
	return kind
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
