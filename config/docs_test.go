package config

import (
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/timeout"
)

const docsPath = "../docs/configuration.md"

func readDocs(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(docsPath)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestDocsExampleIsFullYAML: the complete example of the documentation is
// testdata/valid/full.yaml (which TestValid loads and checks).
func TestDocsExampleIsFullYAML(t *testing.T) {
	docs := readDocs(t)
	_, after, ok := strings.Cut(docs, "## Complete example")
	if !ok {
		t.Fatal("docs have no Complete example section")
	}
	_, block, ok := strings.Cut(after, "```yaml\n")
	if !ok {
		t.Fatal("no yaml block in the Complete example section")
	}
	block, _, _ = strings.Cut(block, "```")
	full, err := os.ReadFile("testdata/valid/full.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if block != string(full) {
		t.Errorf("the example in %s differs from testdata/valid/full.yaml", docsPath)
	}
}

// TestDocsCoverEveryKey: every key of the schema appears in the reference
// (as `path`, list elements as `path[].key`), with its default.
func TestDocsCoverEveryKey(t *testing.T) {
	docs := readDocs(t)
	keysType := reflect.TypeFor[timeout.Keys]()
	var walk func(n *node, path string)
	walk = func(n *node, path string) {
		for _, c := range n.children {
			p := joinKey(path, c.key)
			if (c.kind != kindSection || c.typ == keysType) && !strings.Contains(docs, "`"+p+"`") {
				t.Errorf("%s does not document `%s`", docsPath, p)
			}
			switch {
			case c.typ == keysType: // channels.*.timeouts: the keys of agents.defaults
			case c.kind == kindSection:
				walk(c, p)
			case c.kind == kindList:
				walk(c, p+"[]")
			}
		}
	}
	walk(rootSchema(), "")

	rows := map[string]string{}
	for _, line := range strings.Split(docs, "\n") {
		if rest, ok := strings.CutPrefix(line, "| `"); ok {
			key, _, _ := strings.Cut(rest, "`")
			if _, seen := rows[key]; !seen {
				rows[key] = line
			}
		}
	}
	for key, v := range defaults() {
		var want string
		switch v := v.(type) {
		case float64:
			want = strconv.FormatFloat(v, 'f', -1, 64)
		case time.Duration:
			want = fmt.Sprintf("%dm", v/time.Minute)
		default:
			want = fmt.Sprint(v)
		}
		if row, ok := rows[key]; !ok || !strings.Contains(row, "`"+want+"`") {
			t.Errorf("the row of `%s` does not give the default `%s`: %q", key, want, row)
		}
	}
}

// TestDocsMessages: every template is documented with its built-in text.
func TestDocsMessages(t *testing.T) {
	docs := readDocs(t)
	for name, text := range messages.Defaults {
		if !strings.Contains(docs, "`messages."+string(name)+"`") {
			t.Errorf("`messages.%s` is not documented", name)
		}
		if !strings.Contains(docs, "| `"+string(name)+"` |") || !strings.Contains(docs, "`"+text+"`") {
			t.Errorf("the built-in text of %s is not in the templates table", name)
		}
	}
	for _, field := range []string{"Elapsed", "LastStep", "CurrentStep", "StepTimeout", "Limit", "Error"} {
		if _, ok := reflect.TypeFor[messages.Fields]().FieldByName(field); !ok {
			t.Errorf("messages.Fields has no %s", field)
		}
		if !strings.Contains(docs, "| `."+field+"` |") {
			t.Errorf("field .%s is not documented", field)
		}
	}
}

// TestDocsListBounds: the row of every bounded key gives its range's upper
// bound, so the documentation and the validation cannot drift apart.
func TestDocsListBounds(t *testing.T) {
	docs := readDocs(t)
	rows := map[string]string{}
	for _, line := range strings.Split(docs, "\n") {
		if rest, ok := strings.CutPrefix(line, "| `"); ok {
			key, _, _ := strings.Cut(rest, "`")
			rows[key] = line
		}
	}
	check := func(key string, b bound) {
		row, ok := rows[key]
		if !ok {
			t.Errorf("no row for `%s`", key)
			return
		}
		typ := strings.Split(row, " | ")[1]
		if max := strconv.FormatFloat(b.max, 'f', -1, 64); !strings.Contains(typ, max) && !strings.Contains(typ, "≤ "+b.maxText) {
			t.Errorf("the type column of `%s` (%q) does not give its bound %s", key, typ, b)
		}
	}
	for key, b := range bounds {
		check(key, b)
	}
	for name, b := range timeoutBounds {
		check("agents.defaults."+name, b)
	}
}
