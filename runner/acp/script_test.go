package acp_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// scriptAgent is the fake agent of modes script and dup: each prompt's text
// is a command, run against the client, whose outcome is the reply:
//
//	echo                      replies "echo <sessionId>"
//	read N PATH [LINE LIMIT]  sends N fs/read_text_file of PATH at once,
//	                          replies with the tally of the answers
//	                          ("content <len>" or "error <message>") as
//	                          "<count>× <answer>" joined by "; "
//	tools N                   sends N tool_call updates with unique ids
//	                          that never complete, replies "sent N"
//	ask OPTIONS               sends session/request_permission with
//	                          OPTIONS (JSON), replies with the answer
//
// In mode dup every session/new answers sessionId "same".
func scriptAgent(dup bool) {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	var mu sync.Mutex
	out := json.NewEncoder(os.Stdout)
	send := func(v map[string]any) {
		v["jsonrpc"] = "2.0"
		mu.Lock()
		_ = out.Encode(v)
		mu.Unlock()
	}
	var (
		sessions int
		prompt   json.RawMessage // the running prompt's id
		session  string
		want     int            // answers still awaited
		tally    map[string]int // answers by outcome
	)
	reply := func(text string) {
		send(map[string]any{"method": "session/update", "params": map[string]any{"sessionId": session,
			"update": map[string]any{"sessionUpdate": "agent_message_chunk", "content": map[string]any{"type": "text", "text": text}}}})
		send(map[string]any{"id": prompt, "result": map[string]any{"stopReason": "end_turn"}})
	}
	for in.Scan() {
		var m fakeMessage
		if json.Unmarshal(in.Bytes(), &m) != nil {
			continue
		}
		switch m.Method {
		case "initialize":
			send(map[string]any{"id": m.ID, "result": map[string]any{"protocolVersion": 1}})
			continue
		case "session/new":
			sessions++
			id := "s" + strconv.Itoa(sessions)
			if dup {
				id = "same"
			}
			send(map[string]any{"id": m.ID, "result": map[string]any{"sessionId": id}})
			continue
		case "session/prompt":
			prompt, session = m.ID, m.Params.SessionID
			var text string
			if len(m.Params.Prompt) > 0 {
				text = m.Params.Prompt[0].Text
			}
			f := strings.Fields(text)
			n := 0
			if len(f) > 1 {
				n, _ = strconv.Atoi(f[1])
			}
			switch {
			case len(f) >= 3 && f[0] == "read":
				want, tally = n, map[string]int{}
				params := map[string]any{"sessionId": session, "path": f[2]}
				if len(f) == 5 {
					params["line"], _ = strconv.Atoi(f[3])
					params["limit"], _ = strconv.Atoi(f[4])
				}
				go func() { // the client's answers are read meanwhile
					for i := range n {
						send(map[string]any{"id": fmt.Sprintf("r%d", i), "method": "fs/read_text_file", "params": params})
					}
				}()
			case len(f) == 2 && f[0] == "tools":
				// Written by hand: encoding/json under the race detector
				// would make the fake, not the client, the slow side.
				mu.Lock()
				w := bufio.NewWriterSize(os.Stdout, 64<<10)
				for i := range n {
					fmt.Fprintf(w, `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":%q,"update":{"sessionUpdate":"tool_call","toolCallId":"call-%d","title":"t","status":"pending"}}}`+"\n", session, i)
				}
				_ = w.Flush()
				mu.Unlock()
				reply("sent " + f[1])
			case len(f) > 1 && f[0] == "ask":
				want, tally = 1, map[string]int{}
				send(map[string]any{"id": "ask", "method": "session/request_permission", "params": map[string]any{"sessionId": session,
					"toolCall": map[string]any{"toolCallId": "c1", "title": "do it"}, "options": json.RawMessage(strings.TrimPrefix(text, "ask "))}})
			default:
				reply("echo " + session)
			}
			continue
		}
		if m.Method != "" || want == 0 {
			continue
		}
		// An answer to one of our requests.
		switch {
		case m.Error != nil:
			tally["error "+m.Error.Message]++
		default:
			var r struct {
				Content *string `json:"content"`
			}
			if json.Unmarshal(m.Result, &r) == nil && r.Content != nil {
				tally["content "+strconv.Itoa(len(*r.Content))]++
			} else {
				tally["result "+string(m.Result)]++
			}
		}
		if want--; want == 0 {
			var parts []string
			for k, v := range tally {
				parts = append(parts, fmt.Sprintf("%d× %s", v, k))
			}
			slices.Sort(parts)
			reply(strings.Join(parts, "; "))
		}
	}
}
