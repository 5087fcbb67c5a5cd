package config

import (
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"
)

// The schema is the tree of configuration keys, derived once from the koanf
// tags of Config. The environment reader uses it to map a variable name onto
// a camelCase key and to type the value; the unknown-key error uses it to
// suggest the key that was probably meant; String uses the same tags to print
// a Config in the shape of the YAML file.

type nodeKind int

const (
	kindSection nodeKind = iota // a struct: named children
	kindValue                   // a scalar, or a list of scalars
	kindMap                     // map[string]string: messages, agents.exec.env
	kindList                    // a list of sections: agents.openai.tools.commands
	kindFree                    // map[string]any: a free JSON-schema map
)

type node struct {
	key      string // the camelCase key of this level ("" for the root)
	path     string // the full dotted path ("" for the root)
	typ      reflect.Type
	kind     nodeKind
	children []*node // of a section, or of each element of a list
}

var durationType = reflect.TypeFor[time.Duration]()

var rootSchema = sync.OnceValue(func() *node {
	return buildNode("", "", reflect.TypeFor[Config]())
})

func buildNode(key, path string, t reflect.Type) *node {
	n := &node{key: key, path: path, typ: t, kind: kindValue}
	switch {
	case t == durationType:
	case t.Kind() == reflect.Struct:
		n.kind = kindSection
		n.children = structChildren(path, t)
	case t.Kind() == reflect.Map && t.Elem().Kind() == reflect.String:
		n.kind = kindMap
	case t.Kind() == reflect.Map:
		n.kind = kindFree
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct:
		n.kind = kindList
		n.children = structChildren(path, t.Elem())
	}
	return n
}

// structChildren lists the keys of a struct, inlining ",squash" fields and
// skipping unexported ones.
func structChildren(path string, t reflect.Type) []*node {
	var out []*node
	for f := range t.Fields() {
		name, opts, _ := strings.Cut(f.Tag.Get("koanf"), ",")
		if slices.Contains(strings.Split(opts, ","), "squash") {
			out = append(out, structChildren(path, f.Type)...)
			continue
		}
		if !f.IsExported() || name == "" || name == "-" {
			continue
		}
		out = append(out, buildNode(name, joinKey(path, name), f.Type))
	}
	return out
}

func joinKey(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// child returns the child whose key is exactly key.
func (n *node) child(key string) *node {
	for _, c := range n.children {
		if c.key == key {
			return c
		}
	}
	return nil
}

// foldKey is how an environment variable segment is compared with a key:
// case-insensitive, with underscores ignored (STEP_TIMEOUT_SECONDS and
// STEPTIMEOUTSECONDS both mean stepTimeoutSeconds).
func foldKey(s string) string {
	return strings.ToLower(strings.ReplaceAll(s, "_", ""))
}

// childFold returns the child whose key matches seg as foldKey compares.
func (n *node) childFold(seg string) *node {
	f := foldKey(seg)
	for _, c := range n.children {
		if foldKey(c.key) == f {
			return c
		}
	}
	return nil
}

// lookup follows a mapstructure field path ("agents.openai.tools.commands[0]")
// through the schema; indices step into list elements.
func (n *node) lookup(path string) *node {
	if path == "" {
		return n
	}
	cur := n
	for _, seg := range strings.Split(path, ".") {
		seg, _, _ = strings.Cut(seg, "[")
		if cur = cur.child(seg); cur == nil {
			return nil
		}
	}
	return cur
}

// suggest returns the key of n that an unknown key was probably meant to
// be: the same letters in another case, a typo (one or two letters off), or
// the same word with a suffix missing or extra ("stepTimeout" →
// "stepTimeoutSeconds"). "" when there is no single best guess.
func (n *node) suggest(unknown string) string {
	u := foldKey(unknown)
	if u == "" {
		return ""
	}
	best, bestScore, tie := "", 3, false
	for _, c := range n.children {
		k := foldKey(c.key)
		score := editDistance(u, k)
		if len(u) >= 4 && (strings.HasPrefix(k, u) || strings.HasPrefix(u, k)) {
			score = min(score, 2)
		}
		if limit := min(2, len(u)/3); score > limit && k != u {
			continue
		}
		switch {
		case score < bestScore:
			best, bestScore, tie = c.key, score, false
		case score == bestScore:
			tie = true
		}
	}
	if tie {
		return ""
	}
	return best
}

// editDistance is the optimal-string-alignment distance of a and b (bytes):
// Levenshtein's insertions, deletions and substitutions, and a swap of two
// neighbouring letters counted as one edit, so "tokne" is one typo away
// from "token".
func editDistance(a, b string) int {
	// Three rows (two back, one back, this one): memory is O(len(b)), a
	// schema key, however long the unknown key a file holds.
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}

// toPlain converts a configuration value to maps, slices and scalars keyed
// by the koanf tags, for printing. Unset pointers and empty maps and slices
// are left out; durations print as Go durations ("10m0s").
func toPlain(v reflect.Value) any {
	switch {
	case v.Type() == durationType:
		return time.Duration(v.Int()).String()
	case v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface:
		if v.IsNil() {
			return nil
		}
		return toPlain(v.Elem())
	case v.Kind() == reflect.Struct:
		m := map[string]any{}
		plainFields(v, m)
		return m
	case v.Kind() == reflect.Map:
		if v.Len() == 0 {
			return nil
		}
		m := make(map[string]any, v.Len())
		for it := v.MapRange(); it.Next(); {
			m[it.Key().String()] = toPlain(it.Value())
		}
		return m
	case v.Kind() == reflect.Slice:
		if v.Len() == 0 {
			return nil
		}
		s := make([]any, v.Len())
		for i := range s {
			s[i] = toPlain(v.Index(i))
		}
		return s
	case v.Kind() == reflect.String:
		return v.String() // drops named string types (LivenessMode)
	}
	return v.Interface()
}

func plainFields(v reflect.Value, m map[string]any) {
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("koanf"), ",")
		if slices.Contains(strings.Split(opts, ","), "squash") {
			plainFields(v.Field(i), m)
			continue
		}
		if !f.IsExported() || name == "" || name == "-" {
			continue
		}
		if p := toPlain(v.Field(i)); p != nil {
			m[name] = p
		}
	}
}
