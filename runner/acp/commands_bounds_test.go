package acp

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// TestCommandsAndModesAreBounded: what an agent says of its commands and
// modes is kept within bounds — names by Telegram's rule, no repeats, at
// most maxCommands commands and maxModes modes, descriptions one line cut
// to maxCommandDesc runes, and at most maxMetaSessions sessions per agent.
func TestCommandsAndModesAreBounded(t *testing.T) {
	many := make([]map[string]string, 10000)
	for i := range many {
		many[i] = map[string]string{"name": fmt.Sprintf("c%d", i), "description": strings.Repeat("é", 1000)}
	}
	for _, tc := range []struct {
		name string
		in   any
		want int
		desc int // runes of the first description
	}{
		{"10,000 commands with 1,000-rune descriptions", many, maxCommands, maxCommandDesc},
		{"names Telegram refuses, repeats and a leading slash", []map[string]string{
			{"name": "Echo"}, {"name": "/echo"}, {"name": "with space"}, {"name": "dash-ed"}, {"name": ""},
			{"name": strings.Repeat("a", 33)}, {"name": strings.Repeat("a", 32)}, {"name": "ünï"},
		}, 2, 0},
		{"not a list", map[string]string{"name": "x"}, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw, _ := json.Marshal(tc.in)
			got := parseCommands(raw)
			if len(got) != tc.want {
				t.Fatalf("%d commands kept, want %d: %v", len(got), tc.want, got)
			}
			for _, c := range got {
				if !commandName.MatchString(c.Name) {
					t.Errorf("kept name %q", c.Name)
				}
			}
			if tc.want > 0 {
				if n := len([]rune(got[0].Description)); n != tc.desc {
					t.Errorf("description of %d runes, want %d", n, tc.desc)
				}
			}
		})
	}

	modes := make([]map[string]string, 1000)
	for i := range modes {
		modes[i] = map[string]string{"id": fmt.Sprintf("m%d", i%500), "name": strings.Repeat("n", 500)}
	}
	modes[0]["id"] = strings.Repeat("x", maxModeID+1)
	raw, _ := json.Marshal(map[string]any{"currentModeId": strings.Repeat("y", 10000), "availableModes": modes})
	ms, ok := parseModes(raw)
	if !ok || len(ms.Available) != maxModes || ms.Available[0].ID != "m1" || len(ms.Current) != maxModeID || len(ms.Available[0].Name) != maxModeID {
		t.Errorf("modes kept: ok %v, %d, first %q (name %d bytes), current %d bytes", ok, len(ms.Available), ms.Available[0].ID, len(ms.Available[0].Name), len(ms.Current))
	}
	if _, ok := parseModes(json.RawMessage(`{"currentModeId":"a"}`)); ok {
		t.Error("modes without availableModes: ok")
	}

	var m metas
	update := json.RawMessage(`{"sessionUpdate":"available_commands_update","availableCommands":[{"name":"x","description":""}]}`)
	for i := range maxMetaSessions + 500 {
		m.sessionUpdate(fmt.Sprintf("s%d", i), update)
	}
	m.sessionUpdate("", update)
	if len(m.m) != maxMetaSessions {
		t.Errorf("%d sessions kept, want %d", len(m.m), maxMetaSessions)
	}
}
